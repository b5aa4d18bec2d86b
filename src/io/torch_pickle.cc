#include "src/io/torch_pickle.h"

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>

#include "src/io/zip.h"

namespace loom {
namespace {

// A value of the restricted unpickler. Every value lives in the unpickler's
// pool; containers, the stack and the memo hold plain pointers into it, so
// the memo and the stack see one object (SETITEMS on a memoized dict), a list
// appended to itself is no reference cycle, and freeing a deeply nested value
// recurses nowhere.
struct Value;
using Ref = Value*;

struct Value {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kStr,
    kTuple,
    kList,
    kDict,
    kGlobal,   // s = "module.name"
    kStorage,  // dtype, s = key, i = numel
    kTensor,   // dtype, s = storage key, i = offset, shape, stride
  };
  Kind kind = Kind::kNone;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<Ref> items;                    // tuple, list
  std::vector<std::pair<Ref, Ref>> entries;  // dict
  DType dtype = DType::kF32;                 // storage, tensor
  int64_t storage_numel = 0;                 // tensor
  std::vector<int64_t> shape, stride;        // tensor
};

// Bounds on a hostile file: the values made (a state dict of 10,000
// tensors makes ~150,000), a memo index.
constexpr size_t kMaxValues = size_t{1} << 21;
constexpr size_t kMaxDepth = size_t{1} << 20;
constexpr int64_t kMaxPickleBytes = int64_t{64} << 20;
constexpr int64_t kMaxStorageBytes = int64_t{1} << 36;

// torch's typed storage class -> element type.
bool StorageDType(const std::string& global, DType* dtype) {
  static const std::map<std::string, DType> kTypes = {
      {"torch.FloatStorage", DType::kF32},
      {"torch.HalfStorage", DType::kF16},
      {"torch.BFloat16Storage", DType::kBF16},
      {"torch.DoubleStorage", DType::kF64},
      {"torch.LongStorage", DType::kI64},
      {"torch.IntStorage", DType::kI32}};
  const auto it = kTypes.find(global);
  if (it == kTypes.end()) return false;
  *dtype = it->second;
  return true;
}

class Unpickler {
 public:
  Unpickler(const std::string& bytes, const std::string& name)
      : p_(bytes), name_(name) {}

  StatusOr<Ref> Run() {
    while (true) {
      if (pos_ >= p_.size()) return Error("ends before STOP");
      const size_t at = pos_;
      const auto op = static_cast<uint8_t>(p_[pos_++]);
      if (op == '.') {
        if (stack_.size() != 1)
          return Error("STOP with a stack of " + std::to_string(stack_.size()));
        return stack_.back();
      }
      RETURN_IF_ERROR(Step(op, at));
      if (pool_.size() > kMaxValues || stack_.size() > kMaxValues)
        return Error("more than " + std::to_string(kMaxValues) + " values");
    }
  }

 private:
  Status Error(const std::string& what) const {
    return InvalidArgumentError(name_ + ": data.pkl: " + what + " (at byte " +
                                std::to_string(pos_) + ")");
  }

  StatusOr<uint64_t> Uint(size_t n) {
    if (p_.size() - pos_ < n) return Error("truncated");
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k)
      v |= static_cast<uint64_t>(static_cast<uint8_t>(p_[pos_ + k])) << (8 * k);
    pos_ += n;
    return v;
  }
  StatusOr<std::string> Bytes(uint64_t n) {
    if (p_.size() - pos_ < n) return Error("truncated");
    std::string s = p_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  StatusOr<std::string> Line() {
    const size_t end = p_.find('\n', pos_);
    if (end == std::string::npos) return Error("truncated");
    std::string s = p_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }
  StatusOr<Ref> Pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back()))
      return Error("pops an empty stack");
    Ref v = stack_.back();
    stack_.pop_back();
    return v;
  }
  // The values above the last MARK, which is removed.
  StatusOr<std::vector<Ref>> PopMark() {
    if (marks_.empty()) return Error("no MARK");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<Ref> out(stack_.begin() + static_cast<ptrdiff_t>(m),
                         stack_.end());
    stack_.resize(m);
    return out;
  }
  void Push(Ref v) { stack_.push_back(v); }
  Ref Make(Value::Kind kind) {
    pool_.push_back(std::make_unique<Value>());
    pool_.back()->kind = kind;
    return pool_.back().get();
  }
  Ref Int(int64_t i) {
    Ref v = Make(Value::Kind::kInt);
    v->i = i;
    return v;
  }
  Ref Str(std::string s) {
    Ref v = Make(Value::Kind::kStr);
    v->s = std::move(s);
    return v;
  }
  Ref Tuple(std::vector<Ref> items) {
    Ref v = Make(Value::Kind::kTuple);
    v->items = std::move(items);
    return v;
  }
  StatusOr<Ref> Top() {
    if (stack_.empty()) return Error("an empty stack");
    return stack_.back();
  }

  Status Step(uint8_t op, size_t at);
  Status Memo(uint64_t index) {
    ASSIGN_OR_RETURN(Ref top, Top());
    if (index > kMaxDepth) return Error("memo index " + std::to_string(index));
    memo_[index] = top;
    return Status();
  }
  Status Get(uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end())
      return Error("memo index " + std::to_string(index) + " is unset");
    Push(it->second);
    return Status();
  }
  Status Reduce();
  StatusOr<Ref> PersistentStorage(const Ref& pid);
  StatusOr<Ref> RebuildTensor(const std::vector<Ref>& args);

  const std::string& p_;
  const std::string& name_;
  size_t pos_ = 0;
  std::vector<std::unique_ptr<Value>> pool_;  // owns every value
  std::vector<Ref> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, Ref> memo_;
};

Status Unpickler::Step(uint8_t op, size_t at) {
  switch (op) {
    case 0x80:  // PROTO
      return Uint(1).status();
    case 0x95:  // FRAME
      return Uint(8).status();
    case '(':
      marks_.push_back(stack_.size());
      return Status();
    case ')':
      Push(Tuple({}));
      return Status();
    case 't': {
      ASSIGN_OR_RETURN(std::vector<Ref> items, PopMark());
      Push(Tuple(std::move(items)));
      return Status();
    }
    case 0x85:
    case 0x86:
    case 0x87: {
      std::vector<Ref> items(op - 0x84);
      for (size_t k = items.size(); k-- > 0;) {
        ASSIGN_OR_RETURN(items[k], Pop());
      }
      Push(Tuple(std::move(items)));
      return Status();
    }
    case ']':
      Push(Make(Value::Kind::kList));
      return Status();
    case '}':
      Push(Make(Value::Kind::kDict));
      return Status();
    case 'a':
    case 'e': {
      std::vector<Ref> items;
      if (op == 'a') {
        ASSIGN_OR_RETURN(Ref v, Pop());
        items.push_back(std::move(v));
      } else {
        ASSIGN_OR_RETURN(items, PopMark());
      }
      ASSIGN_OR_RETURN(Ref list, Top());
      if (list->kind != Value::Kind::kList)
        return Error("APPEND to a non-list");
      list->items.insert(list->items.end(), items.begin(), items.end());
      return Status();
    }
    case 's':
    case 'u': {
      std::vector<Ref> items;
      if (op == 's') {
        items.resize(2);
        ASSIGN_OR_RETURN(items[1], Pop());
        ASSIGN_OR_RETURN(items[0], Pop());
      } else {
        ASSIGN_OR_RETURN(items, PopMark());
      }
      if (items.size() % 2 != 0) return Error("SETITEMS with an odd count");
      ASSIGN_OR_RETURN(Ref dict, Top());
      if (dict->kind != Value::Kind::kDict)
        return Error("SETITEM on a non-dict");
      for (size_t k = 0; k < items.size(); k += 2)
        dict->entries.emplace_back(items[k], items[k + 1]);
      return Status();
    }
    case 'X':
    case 0x8c:
    case 0x8d: {
      ASSIGN_OR_RETURN(const uint64_t n, Uint(op == 'X'    ? 4
                                              : op == 0x8c ? 1
                                                           : 8));
      ASSIGN_OR_RETURN(std::string s, Bytes(n));
      Push(Str(std::move(s)));
      return Status();
    }
    case 'J': {
      ASSIGN_OR_RETURN(const uint64_t v, Uint(4));
      Push(Int(static_cast<int32_t>(static_cast<uint32_t>(v))));
      return Status();
    }
    case 'K':
    case 'M': {
      ASSIGN_OR_RETURN(const uint64_t v, Uint(op == 'K' ? 1 : 2));
      Push(Int(static_cast<int64_t>(v)));
      return Status();
    }
    case 0x8a: {  // LONG1: n little-endian two's complement bytes
      ASSIGN_OR_RETURN(const uint64_t n, Uint(1));
      if (n > 8) return Error("an integer of " + std::to_string(n) + " bytes");
      ASSIGN_OR_RETURN(uint64_t v, Uint(n));
      if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1)
        v |= ~uint64_t{0} << (8 * n);
      Push(Int(static_cast<int64_t>(v)));
      return Status();
    }
    case 'G': {  // BINFLOAT, big-endian
      ASSIGN_OR_RETURN(const std::string b, Bytes(8));
      uint64_t bits = 0;
      for (char c : b) bits = (bits << 8) | static_cast<uint8_t>(c);
      Ref v = Make(Value::Kind::kFloat);
      std::memcpy(&v->f, &bits, 8);
      Push(std::move(v));
      return Status();
    }
    case 'N':
      Push(Make(Value::Kind::kNone));
      return Status();
    case 0x88:
    case 0x89: {
      Ref v = Make(Value::Kind::kBool);
      v->i = op == 0x88;
      Push(std::move(v));
      return Status();
    }
    case 'q': {
      ASSIGN_OR_RETURN(const uint64_t i, Uint(1));
      return Memo(i);
    }
    case 'r': {
      ASSIGN_OR_RETURN(const uint64_t i, Uint(4));
      return Memo(i);
    }
    case 0x94:
      return Memo(memo_.size());
    case 'h': {
      ASSIGN_OR_RETURN(const uint64_t i, Uint(1));
      return Get(i);
    }
    case 'j': {
      ASSIGN_OR_RETURN(const uint64_t i, Uint(4));
      return Get(i);
    }
    case 'c': {
      ASSIGN_OR_RETURN(const std::string module, Line());
      ASSIGN_OR_RETURN(const std::string cls, Line());
      Ref g = Make(Value::Kind::kGlobal);
      g->s = module + "." + cls;
      Push(std::move(g));
      return Status();
    }
    case 0x93: {  // STACK_GLOBAL
      ASSIGN_OR_RETURN(const Ref cls, Pop());
      ASSIGN_OR_RETURN(const Ref module, Pop());
      if (cls->kind != Value::Kind::kStr || module->kind != Value::Kind::kStr)
        return Error("STACK_GLOBAL of non-strings");
      Ref g = Make(Value::Kind::kGlobal);
      g->s = module->s + "." + cls->s;
      Push(std::move(g));
      return Status();
    }
    case 'Q': {
      ASSIGN_OR_RETURN(const Ref pid, Pop());
      ASSIGN_OR_RETURN(Ref storage, PersistentStorage(pid));
      Push(std::move(storage));
      return Status();
    }
    case 'R':
      return Reduce();
    case 'b': {  // BUILD: a state dict's _metadata; kept out
      ASSIGN_OR_RETURN(const Ref state, Pop());
      ASSIGN_OR_RETURN(const Ref obj, Top());
      if (obj->kind != Value::Kind::kDict || state->kind != Value::Kind::kDict)
        return Error("BUILD of something other than a state dict");
      return Status();
    }
    default:
      break;
  }
  char hex[8];
  std::snprintf(hex, sizeof(hex), "0x%02x", op);
  pos_ = at;
  return Error(std::string("opcode ") + hex +
               " is outside what a state dict of tensors uses");
}

StatusOr<Ref> Unpickler::PersistentStorage(const Ref& pid) {
  const auto& t = pid->items;
  if (pid->kind != Value::Kind::kTuple || t.size() != 5 ||
      t[0]->kind != Value::Kind::kStr || t[0]->s != "storage" ||
      t[1]->kind != Value::Kind::kGlobal || t[2]->kind != Value::Kind::kStr ||
      t[4]->kind != Value::Kind::kInt)
    return Error(
        "a persistent id other than ('storage', type, key, location, numel)");
  Ref s = Make(Value::Kind::kStorage);
  if (!StorageDType(t[1]->s, &s->dtype))
    return Error("storage type " + t[1]->s +
                 " (Loom reads Float, Half, "
                 "BFloat16, Double, Long and Int storages)");
  if (t[4]->i < 0)
    return Error("a storage of " + std::to_string(t[4]->i) + " elements");
  s->s = t[2]->s;
  s->i = t[4]->i;
  return s;
}

// The ints of a tuple (a size or a stride).
bool Ints(const Ref& v, std::vector<int64_t>* out) {
  if (v->kind != Value::Kind::kTuple) return false;
  for (const Ref& x : v->items) {
    if (x->kind != Value::Kind::kInt || x->i < 0) return false;
    out->push_back(x->i);
  }
  return true;
}

StatusOr<Ref> Unpickler::RebuildTensor(const std::vector<Ref>& args) {
  if (args.size() < 4 || args[0]->kind != Value::Kind::kStorage ||
      args[1]->kind != Value::Kind::kInt)
    return Error(
        "_rebuild_tensor_v2 with arguments other than (storage, "
        "offset, size, stride, ...)");
  Ref t = Make(Value::Kind::kTensor);
  t->dtype = args[0]->dtype;
  t->s = args[0]->s;
  t->storage_numel = args[0]->i;
  t->i = args[1]->i;
  if (!Ints(args[2], &t->shape) || !Ints(args[3], &t->stride) ||
      t->shape.size() != t->stride.size() || t->i < 0)
    return Error("tensor '" + t->s +
                 "': a size or stride that is not a tuple "
                 "of non-negative ints of one length");
  return t;
}

Status Unpickler::Reduce() {
  ASSIGN_OR_RETURN(const Ref args, Pop());
  ASSIGN_OR_RETURN(const Ref callable, Pop());
  if (callable->kind != Value::Kind::kGlobal ||
      args->kind != Value::Kind::kTuple)
    return Error("REDUCE of something other than a known global");
  const std::string& g = callable->s;
  if (g == "collections.OrderedDict" && args->items.empty()) {
    Push(Make(Value::Kind::kDict));
  } else if (g == "torch._utils._rebuild_tensor_v2") {
    ASSIGN_OR_RETURN(Ref t, RebuildTensor(args->items));
    Push(std::move(t));
  } else if (g == "torch._utils._rebuild_parameter" && !args->items.empty() &&
             args->items[0]->kind == Value::Kind::kTensor) {
    Push(args->items[0]);
  } else {
    return Error("calls " + g +
                 ", which Loom does not run (it reads state dicts of tensors "
                 "only, never executing the pickle)");
  }
  return Status();
}

// The tensor's bytes from its storage's: contiguous, inside the storage.
StatusOr<TorchTensor> Materialize(const Value& t, const std::string& key,
                                  const TorchStorageReader& storage,
                                  const std::string& name) {
  const std::string where = name + ": tensor '" + key + "'";
  TorchTensor out;
  out.dtype = t.dtype;
  out.shape = t.shape;
  int64_t numel = 1, expect = 1;
  for (size_t d = t.shape.size(); d-- > 0;) {
    if (t.shape[d] != 1 && t.stride[d] != expect)
      return InvalidArgumentError(where +
                                  " is not contiguous (Loom reads "
                                  "row-major tensors)");
    if (t.shape[d] > 0 && numel > kMaxStorageBytes / t.shape[d])
      return InvalidArgumentError(where + " is too large");
    expect *= t.shape[d];
    numel *= t.shape[d];
  }
  const int64_t elem = DTypeSize(t.dtype);
  if (t.i > t.storage_numel || numel > t.storage_numel - t.i)
    return InvalidArgumentError(where + ": elements [" + std::to_string(t.i) +
                                ", " + std::to_string(t.i + numel) +
                                ") outside its storage of " +
                                std::to_string(t.storage_numel));
  ASSIGN_OR_RETURN(const std::string bytes, storage(t.s));
  if (static_cast<int64_t>(bytes.size()) < t.storage_numel * elem)
    return InvalidArgumentError(where + ": storage '" + t.s + "' holds " +
                                std::to_string(bytes.size()) + " bytes, " +
                                std::to_string(t.storage_numel * elem) +
                                " expected");
  out.data.assign(bytes.begin() + t.i * elem,
                  bytes.begin() + (t.i + numel) * elem);
  return out;
}

}  // namespace

StatusOr<std::vector<std::pair<std::string, TorchTensor>>> ParseTorchStateDict(
    const std::string& pickle, const TorchStorageReader& storage,
    const std::string& name) {
  Unpickler u(pickle, name);
  ASSIGN_OR_RETURN(const Ref root, u.Run());
  if (root->kind != Value::Kind::kDict)
    return InvalidArgumentError(name +
                                ": data.pkl holds no state dict (a "
                                "dict of tensors)");
  std::vector<std::pair<std::string, TorchTensor>> out;
  for (const auto& [k, v] : root->entries) {
    if (k->kind != Value::Kind::kStr || v->kind != Value::Kind::kTensor)
      return InvalidArgumentError(
          name + ": data.pkl: an entry that is not a name and a tensor" +
          (k->kind == Value::Kind::kStr ? " ('" + k->s + "')" : ""));
    ASSIGN_OR_RETURN(TorchTensor t, Materialize(*v, k->s, storage, name));
    out.emplace_back(k->s, std::move(t));
  }
  return out;
}

StatusOr<std::vector<std::pair<std::string, TorchTensor>>> ReadTorchStateDict(
    const std::string& path) {
  ASSIGN_OR_RETURN(const std::unique_ptr<ZipArchive> zip,
                   ZipArchive::Open(path, "torch"));
  std::string prefix;
  bool found = false;
  for (const std::string& m : zip->members()) {
    const size_t slash = m.find('/');
    if (slash != std::string::npos && m.substr(slash) == "/data.pkl") {
      prefix = m.substr(0, slash + 1);
      found = true;
      break;
    }
  }
  if (!found)
    return InvalidArgumentError(path +
                                ": no <archive>/data.pkl (not a zip "
                                "checkpoint of torch.save)");
  if (zip->Has(prefix + "byteorder")) {
    ASSIGN_OR_RETURN(const std::string order,
                     zip->Read(prefix + "byteorder", 64));
    if (order != "little")
      return InvalidArgumentError(path + ": byteorder is '" + order +
                                  "', Loom reads little-endian tensors");
  }
  ASSIGN_OR_RETURN(const std::string pickle,
                   zip->Read(prefix + "data.pkl", kMaxPickleBytes));
  const TorchStorageReader storage =
      [&](const std::string& key) -> StatusOr<std::string> {
    if (key.empty() || key.find('/') != std::string::npos ||
        key.find("..") != std::string::npos)
      return InvalidArgumentError(path + ": storage key '" + key + "'");
    return zip->Read(prefix + "data/" + key, kMaxStorageBytes);
  };
  return ParseTorchStateDict(pickle, storage, path);
}

}  // namespace loom
