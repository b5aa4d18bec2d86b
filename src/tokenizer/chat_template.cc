// Jinja-subset interpreter for chat templates: a lexer that splits the
// source into text and tags (applying trim_blocks / lstrip_blocks / `-`
// whitespace control), a recursive-descent parser to a small AST, and a
// tree-walking evaluator over a small Value type. Written for Loom; see
// chat_template.h for the contract.
#include "src/tokenizer/chat_template.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/base/read_file.h"
#include "src/tokenizer/json_util.h"

namespace loom::tok {
namespace {

constexpr int kMaxParseDepth = 256;  // block nesting
constexpr int kMaxExprDepth = 128;   // expression nesting (parser)
constexpr int kMaxEvalDepth = 256;
constexpr int kMaxValueDepth = 256;  // nesting of lists / dicts in values
constexpr int64_t kMaxLoopIterations = 1'000'000;
constexpr size_t kMaxOutputBytes = size_t{64} << 20;

struct Pos {
  int line = 1;
  int col = 1;
};

std::string PosStr(Pos p) {
  return std::to_string(p.line) + ":" + std::to_string(p.col);
}

Status ErrorAt(Pos p, std::string_view msg) {
  return InvalidArgumentError("chat template " + PosStr(p) + ": " +
                              std::string(msg));
}

// ------------------------------------------------------------------ Value

struct Node;
struct DictData;

struct Value {
  enum class T {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kMacro,
    kBuiltin
  };
  T t = T::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // string; builtin name; name of an undefined value
  std::shared_ptr<std::vector<Value>> list;
  std::shared_ptr<DictData> dict;
  const Node* macro = nullptr;
  bool tuple = false;  // a list that came from a tuple (repr only)

  static Value Undef(std::string name) {
    Value v;
    v.s = std::move(name);
    return v;
  }
  static Value None() { return Make(T::kNone); }
  static Value Bool(bool x) {
    Value v = Make(T::kBool);
    v.b = x;
    return v;
  }
  static Value Int(int64_t x) {
    Value v = Make(T::kInt);
    v.i = x;
    return v;
  }
  static Value Float(double x) {
    Value v = Make(T::kFloat);
    v.f = x;
    return v;
  }
  static Value Str(std::string x) {
    Value v = Make(T::kString);
    v.s = std::move(x);
    return v;
  }
  static Value List(std::vector<Value> items = {}) {
    Value v = Make(T::kList);
    v.list = std::make_shared<std::vector<Value>>(std::move(items));
    return v;
  }
  static Value Tuple(std::vector<Value> items) {
    Value v = List(std::move(items));
    v.tuple = true;
    return v;
  }
  static Value Dict();
  static Value Namespace();

  bool undefined() const { return t == T::kUndefined; }
  bool is_str() const { return t == T::kString; }
  bool is_list() const { return t == T::kList; }
  bool is_dict() const { return t == T::kDict; }
  bool is_number() const {
    return t == T::kInt || t == T::kFloat || t == T::kBool;
  }
  double AsDouble() const {
    return t == T::kFloat ? f : static_cast<double>(t == T::kBool ? b : i);
  }
  int64_t AsInt() const { return t == T::kBool ? b : i; }

 private:
  static Value Make(T t) {
    Value v;
    v.t = t;
    return v;
  }
};

struct DictData {
  std::vector<std::pair<std::string, Value>> items;
  const Value* Find(std::string_view key) const {
    for (const auto& [k, v] : items) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  void Set(const std::string& key, Value v) {
    for (auto& [k, old] : items) {
      if (k == key) {
        old = std::move(v);
        return;
      }
    }
    items.emplace_back(key, std::move(v));
  }
};

Value Value::Dict() {
  Value v = Make(T::kDict);
  v.dict = std::make_shared<DictData>();
  return v;
}
Value Value::Namespace() {
  Value v = Make(T::kNamespace);
  v.dict = std::make_shared<DictData>();
  return v;
}

const char* TypeName(const Value& v) {
  switch (v.t) {
    case Value::T::kUndefined:
      return "undefined";
    case Value::T::kNone:
      return "NoneType";
    case Value::T::kBool:
      return "bool";
    case Value::T::kInt:
      return "int";
    case Value::T::kFloat:
      return "float";
    case Value::T::kString:
      return "str";
    case Value::T::kList:
      return "list";
    case Value::T::kDict:
      return "dict";
    case Value::T::kNamespace:
      return "Namespace";
    case Value::T::kMacro:
      return "Macro";
    case Value::T::kBuiltin:
      return "builtin_function";
  }
  return "?";
}

// Depth of nested containers in `v`, counting stops past `limit` (so
// cycles through namespaces terminate).
int ValueDepth(const Value& v, int limit) {
  if (limit < 0) return 1;
  int d = 0;
  if (v.t == Value::T::kList) {
    for (const Value& x : *v.list) d = std::max(d, ValueDepth(x, limit - 1));
    return d + 1;
  }
  if (v.t == Value::T::kDict || v.t == Value::T::kNamespace) {
    for (const auto& kv : v.dict->items) {
      d = std::max(d, ValueDepth(kv.second, limit - 1));
      if (d > limit) break;
    }
    return d + 1;
  }
  return 0;
}

template <typename J>
Value FromJson(const J& j, int depth, bool* too_deep) {
  if (depth > kMaxValueDepth) {
    *too_deep = true;
    return Value::None();
  }
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::None();
    case nlohmann::json::value_t::boolean:
      return Value::Bool(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::Int(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) {
        return Value::Float(static_cast<double>(u));
      }
      return Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::Float(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::Str(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(FromJson(e, depth + 1, too_deep));
      return Value::List(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value d = Value::Dict();
      for (auto it = j.begin(); it != j.end(); ++it) {
        d.dict->items.emplace_back(it.key(),
                                   FromJson(it.value(), depth + 1, too_deep));
      }
      return d;
    }
    default:
      return Value::None();
  }
}

// ------------------------------------------------------- string helpers

// Byte offsets of the code points of `s`, plus s.size() at the end. Invalid
// bytes count as one code point each.
std::vector<size_t> CodePoints(std::string_view s) {
  std::vector<size_t> out;
  out.reserve(s.size() + 1);
  size_t i = 0;
  while (i < s.size()) {
    out.push_back(i);
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80         ? 1
               : (c >> 5) == 6  ? 2
               : (c >> 4) == 14 ? 3
               : (c >> 3) == 30 ? 4
                                : 1;
    if (i + n > s.size()) n = 1;
    i += n;
  }
  out.push_back(s.size());
  return out;
}

bool IsPySpace(unsigned char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

std::string PyStrip(std::string_view s, bool left, bool right,
                    const std::string* chars) {
  if (chars == nullptr) {
    size_t b = 0, e = s.size();
    if (left) {
      while (b < e && IsPySpace(s[b])) ++b;
    }
    if (right) {
      while (e > b && IsPySpace(s[e - 1])) --e;
    }
    return std::string(s.substr(b, e - b));
  }
  const std::vector<size_t> set_cp = CodePoints(*chars);
  auto in_set = [&](std::string_view cp) {
    for (size_t k = 0; k + 1 < set_cp.size(); ++k) {
      if (std::string_view(*chars).substr(set_cp[k],
                                          set_cp[k + 1] - set_cp[k]) == cp) {
        return true;
      }
    }
    return false;
  };
  const std::vector<size_t> cp = CodePoints(s);
  size_t b = 0, e = cp.size() - 1;
  if (left) {
    while (b < e && in_set(s.substr(cp[b], cp[b + 1] - cp[b]))) ++b;
  }
  if (right) {
    while (e > b && in_set(s.substr(cp[e - 1], cp[e] - cp[e - 1]))) --e;
  }
  return std::string(s.substr(cp[b], cp[e] - cp[b]));
}

std::string AsciiUpper(std::string s) {
  for (char& c : s) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return s;
}
std::string AsciiLower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}
bool IsAlpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
// Python str.title (ASCII letters).
std::string PyTitle(std::string s) {
  bool prev_alpha = false;
  for (char& c : s) {
    if (IsAlpha(c)) {
      std::string one(1, c);
      c = prev_alpha ? AsciiLower(one)[0] : AsciiUpper(one)[0];
      prev_alpha = true;
    } else {
      prev_alpha = false;
    }
  }
  return s;
}
std::string PyCapitalize(std::string s) {
  s = AsciiLower(std::move(s));
  if (!s.empty()) s[0] = AsciiUpper(s.substr(0, 1))[0];
  return s;
}

std::string ReplaceAll(const std::string& s, const std::string& from,
                       const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between every code point.
    const std::vector<size_t> cp = CodePoints(s);
    int64_t n = 0;
    for (size_t k = 0; k + 1 < cp.size(); ++k) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      out.append(s, cp[k], cp[k + 1] - cp[k]);
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

// Python repr() of a float (shortest round-trip digits).
std::string PyFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto r =
      std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  std::string sign;
  if (!sci.empty() && sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t k = 0; k < e; ++k) {
    if (sci[k] != '.') digits += sci[k];
  }
  const int exp = std::atoi(sci.c_str() + e + 1);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      std::string ip =
          digits.substr(0, std::min<size_t>(digits.size(), exp + 1));
      while (ip.size() < static_cast<size_t>(exp + 1)) ip += '0';
      std::string fp = digits.size() > static_cast<size_t>(exp + 1)
                           ? digits.substr(exp + 1)
                           : "0";
      out = ip + "." + fp;
    } else {
      out = "0." + std::string(-exp - 1, '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+',
                  exp < 0 ? -exp : exp);
    out += eb;
  }
  return sign + out;
}

std::string PyReprStr(const std::string& s) {
  const bool dq =
      s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == q || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else {
      out += ch;
    }
  }
  out += q;
  return out;
}

std::string Repr(const Value& v);

// Python str() of a value, as `{{ }}`, `~` and `string` produce it.
std::string ToStr(const Value& v) {
  switch (v.t) {
    case Value::T::kUndefined:
      return "";
    case Value::T::kString:
      return v.s;
    default:
      return Repr(v);
  }
}

std::string Repr(const Value& v) {
  switch (v.t) {
    case Value::T::kUndefined:
      return "";
    case Value::T::kNone:
      return "None";
    case Value::T::kBool:
      return v.b ? "True" : "False";
    case Value::T::kInt:
      return std::to_string(v.i);
    case Value::T::kFloat:
      return PyFloat(v.f);
    case Value::T::kString:
      return PyReprStr(v.s);
    case Value::T::kList: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += Repr((*v.list)[k]);
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Value::T::kDict:
    case Value::T::kNamespace: {
      std::string out = v.t == Value::T::kNamespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, e] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += PyReprStr(k) + ": " + Repr(e);
      }
      return out + (v.t == Value::T::kNamespace ? "}>" : "}");
    }
    case Value::T::kMacro:
      return "<Macro>";
    case Value::T::kBuiltin:
      return "<built-in function " + v.s + ">";
  }
  return "";
}

void JsonEscape(const std::string& s, std::string* out) {
  *out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof(b), "\\u%04x", c);
          *out += b;
        } else {
          *out += ch;
        }
    }
  }
  *out += '"';
}

// Python json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=...).
// indent < 0 means None.
bool PyJson(const Value& v, int indent, bool sort_keys, int level,
            std::string* out) {
  if (level > kMaxEvalDepth) return false;
  auto newline = [&](int lvl) {
    *out += '\n';
    out->append(static_cast<size_t>(indent) * lvl, ' ');
  };
  switch (v.t) {
    case Value::T::kNone:
      *out += "null";
      return true;
    case Value::T::kBool:
      *out += v.b ? "true" : "false";
      return true;
    case Value::T::kInt:
      *out += std::to_string(v.i);
      return true;
    case Value::T::kFloat:
      if (std::isnan(v.f)) {
        *out += "NaN";
      } else if (std::isinf(v.f)) {
        *out += v.f < 0 ? "-Infinity" : "Infinity";
      } else {
        *out += PyFloat(v.f);
      }
      return true;
    case Value::T::kString:
      JsonEscape(v.s, out);
      return true;
    case Value::T::kList: {
      if (v.list->empty()) {
        *out += "[]";
        return true;
      }
      *out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) *out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(level + 1);
        if (!PyJson((*v.list)[k], indent, sort_keys, level + 1, out)) {
          return false;
        }
      }
      if (indent >= 0) newline(level);
      *out += ']';
      return true;
    }
    case Value::T::kDict: {
      if (v.dict->items.empty()) {
        *out += "{}";
        return true;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      *out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) *out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(level + 1);
        JsonEscape(items[k]->first, out);
        *out += ": ";
        if (!PyJson(items[k]->second, indent, sort_keys, level + 1, out)) {
          return false;
        }
      }
      if (indent >= 0) newline(level);
      *out += '}';
      return true;
    }
    default:
      return false;
  }
}

bool Truthy(const Value& v) {
  switch (v.t) {
    case Value::T::kUndefined:
    case Value::T::kNone:
      return false;
    case Value::T::kBool:
      return v.b;
    case Value::T::kInt:
      return v.i != 0;
    case Value::T::kFloat:
      return v.f != 0;
    case Value::T::kString:
      return !v.s.empty();
    case Value::T::kList:
      return !v.list->empty();
    case Value::T::kDict:
      return !v.dict->items.empty();
    default:
      return true;
  }
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.t == Value::T::kFloat || b.t == Value::T::kFloat) {
      return a.AsDouble() == b.AsDouble();
    }
    return a.AsInt() == b.AsInt();
  }
  if (a.t != b.t) return false;
  switch (a.t) {
    case Value::T::kUndefined:
    case Value::T::kNone:
      return true;
    case Value::T::kString:
      return a.s == b.s;
    case Value::T::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!Equal((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    case Value::T::kDict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->Find(k);
        if (o == nullptr || !Equal(v, *o)) return false;
      }
      return true;
    case Value::T::kNamespace:
      return a.dict == b.dict;
    case Value::T::kMacro:
      return a.macro == b.macro;
    case Value::T::kBuiltin:
      return a.s == b.s;
    default:
      return false;
  }
}

// -1, 0, 1; nullopt when the types cannot be ordered.
std::optional<int> Compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.AsDouble(), y = b.AsDouble();
    if (a.t != Value::T::kFloat && b.t != Value::T::kFloat) {
      return a.AsInt() < b.AsInt() ? -1 : a.AsInt() > b.AsInt() ? 1 : 0;
    }
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_str() && b.is_str()) {
    const int c = a.s.compare(b.s);
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list()) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (Equal((*a.list)[k], (*b.list)[k])) continue;
      return Compare((*a.list)[k], (*b.list)[k]);
    }
    return a.list->size() < b.list->size()   ? -1
           : a.list->size() > b.list->size() ? 1
                                             : 0;
  }
  return std::nullopt;
}

// ----------------------------------------------------------------- Lexer

struct Tok {
  enum class K { kName, kString, kInt, kFloat, kOp };
  K k = K::kOp;
  std::string s;
  int64_t i = 0;
  double f = 0;
  Pos pos;
};

struct Chunk {
  enum class K { kText, kExpr, kStmt, kComment };
  K k = K::kText;
  std::string text;
  std::vector<Tok> toks;
  Pos pos;
  Pos end_pos;
  bool strip_before = false;  // `{%-`: strip whitespace before the tag
  bool strip_after = false;   // `-%}`: strip whitespace after the tag
  bool no_lstrip = false;     // `{%+`: lstrip_blocks off for this tag
  bool raw_begin = false;     // `{% raw %}`: trim_blocks does not apply
};

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {
    line_starts_.push_back(0);
    for (size_t k = 0; k < src_.size(); ++k) {
      if (src_[k] == '\n') line_starts_.push_back(k + 1);
    }
  }

  StatusOr<std::vector<Chunk>> Run() {
    std::vector<Chunk> chunks;
    size_t p = 0;
    while (p < src_.size()) {
      size_t open = p;
      while (true) {
        open = src_.find('{', open);
        if (open == std::string::npos || open + 1 >= src_.size()) {
          open = std::string::npos;
          break;
        }
        const char n = src_[open + 1];
        if (n == '{' || n == '%' || n == '#') break;
        ++open;
      }
      if (open == std::string::npos) {
        AddText(&chunks, p, src_.size());
        break;
      }
      AddText(&chunks, p, open);
      const char kind = src_[open + 1];
      Chunk c;
      c.pos = PosOf(open);
      size_t q = open + 2;
      if (q < src_.size() && src_[q] == '-') {
        c.strip_before = true;
        ++q;
      } else if (q < src_.size() && src_[q] == '+' && kind != '{') {
        c.no_lstrip = true;
        ++q;
      }
      if (kind == '#') {
        c.k = Chunk::K::kComment;
        const size_t close = src_.find("#}", q);
        if (close == std::string::npos) {
          return ErrorAt(c.pos, "unterminated comment '{#'");
        }
        c.strip_after = close > q && src_[close - 1] == '-';
        p = close + 2;
        chunks.push_back(std::move(c));
        continue;
      }
      c.k = kind == '{' ? Chunk::K::kExpr : Chunk::K::kStmt;
      ASSIGN_OR_RETURN(p, LexTag(q, &c));
      const bool is_raw = c.k == Chunk::K::kStmt && c.toks.size() == 1 &&
                          c.toks[0].k == Tok::K::kName && c.toks[0].s == "raw";
      c.raw_begin = is_raw;
      chunks.push_back(std::move(c));
      if (is_raw) RETURN_IF_ERROR(LexRaw(&chunks, &p));
    }
    ApplyWhitespaceControl(&chunks);
    return chunks;
  }

 private:
  Pos PosOf(size_t off) const {
    const auto it =
        std::upper_bound(line_starts_.begin(), line_starts_.end(), off);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    return {static_cast<int>(line),
            static_cast<int>(off - line_starts_[line - 1] + 1)};
  }

  void AddText(std::vector<Chunk>* chunks, size_t b, size_t e) {
    if (e <= b) return;
    Chunk c;
    c.k = Chunk::K::kText;
    c.text = src_.substr(b, e - b);
    c.pos = PosOf(b);
    chunks->push_back(std::move(c));
  }

  // After `{% raw %}`: the text up to `{% endraw %}` is literal.
  Status LexRaw(std::vector<Chunk>* chunks, size_t* p) {
    size_t search = *p;
    while (true) {
      const size_t open = src_.find("{%", search);
      if (open == std::string::npos) {
        return ErrorAt(chunks->back().pos, "missing {% endraw %} for raw");
      }
      size_t q = open + 2;
      Chunk end;
      end.k = Chunk::K::kStmt;
      end.pos = PosOf(open);
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) {
        end.strip_before = src_[q] == '-';
        end.no_lstrip = src_[q] == '+';
        ++q;
      }
      while (q < src_.size() && IsPySpace(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      q += 6;
      while (q < src_.size() && IsPySpace(src_[q])) ++q;
      if (q < src_.size() && src_[q] == '-') {
        end.strip_after = true;
        ++q;
      }
      if (src_.compare(q, 2, "%}") != 0) {
        return ErrorAt(end.pos, "malformed {% endraw %}");
      }
      AddText(chunks, *p, open);
      Tok t;
      t.k = Tok::K::kName;
      t.s = "endraw";
      t.pos = end.pos;
      end.toks.push_back(t);
      chunks->push_back(std::move(end));
      *p = q + 2;
      return Status::Ok();
    }
  }

  // Lexes expression tokens from `p` up to the tag end; returns the offset
  // after the tag.
  StatusOr<size_t> LexTag(size_t p, Chunk* c) {
    const bool expr = c->k == Chunk::K::kExpr;
    const char* end = expr ? "}}" : "%}";
    int depth = 0;
    while (true) {
      while (p < src_.size() && IsPySpace(src_[p])) ++p;
      if (p >= src_.size()) {
        return ErrorAt(c->pos,
                       expr ? "unterminated '{{'" : "unterminated '{%'");
      }
      if (depth == 0) {
        if (src_.compare(p, 2, end) == 0) {
          c->end_pos = PosOf(p);
          return p + 2;
        }
        if (src_[p] == '-' && src_.compare(p + 1, 2, end) == 0) {
          c->strip_after = true;
          c->end_pos = PosOf(p);
          return p + 3;
        }
      }
      Tok t;
      t.pos = PosOf(p);
      const char ch = src_[p];
      if (ch == '\'' || ch == '"') {
        t.k = Tok::K::kString;
        ++p;
        bool closed = false;
        while (p < src_.size()) {
          const char x = src_[p];
          if (x == ch) {
            closed = true;
            ++p;
            break;
          }
          if (x == '\\' && p + 1 < src_.size()) {
            const char e = src_[p + 1];
            p += 2;
            switch (e) {
              case 'n':
                t.s += '\n';
                break;
              case 't':
                t.s += '\t';
                break;
              case 'r':
                t.s += '\r';
                break;
              case '\\':
                t.s += '\\';
                break;
              case '\'':
                t.s += '\'';
                break;
              case '"':
                t.s += '"';
                break;
              case '\n':
                break;
              case 'b':
                t.s += '\b';
                break;
              case 'f':
                t.s += '\f';
                break;
              case 'v':
                t.s += '\v';
                break;
              case '0':
                t.s += '\0';
                break;
              case 'x':
              case 'u':
              case 'U': {
                const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
                uint32_t cp = 0;
                bool ok = p + n <= src_.size();
                for (size_t k = 0; ok && k < n; ++k) {
                  const char h = src_[p + k];
                  cp <<= 4;
                  if (h >= '0' && h <= '9') {
                    cp |= h - '0';
                  } else if (h >= 'a' && h <= 'f') {
                    cp |= h - 'a' + 10;
                  } else if (h >= 'A' && h <= 'F') {
                    cp |= h - 'A' + 10;
                  } else {
                    ok = false;
                  }
                }
                if (!ok || cp > 0x10FFFF) {
                  return ErrorAt(t.pos, "bad \\" + std::string(1, e) +
                                            " escape in string literal");
                }
                p += n;
                if (cp < 0x80) {
                  t.s += static_cast<char>(cp);
                } else if (cp < 0x800) {
                  t.s += static_cast<char>(0xC0 | (cp >> 6));
                  t.s += static_cast<char>(0x80 | (cp & 0x3F));
                } else if (cp < 0x10000) {
                  t.s += static_cast<char>(0xE0 | (cp >> 12));
                  t.s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
                  t.s += static_cast<char>(0x80 | (cp & 0x3F));
                } else {
                  t.s += static_cast<char>(0xF0 | (cp >> 18));
                  t.s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
                  t.s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
                  t.s += static_cast<char>(0x80 | (cp & 0x3F));
                }
                break;
              }
              default:
                t.s += '\\';
                t.s += e;
            }
            continue;
          }
          t.s += x;
          ++p;
        }
        if (!closed) return ErrorAt(t.pos, "unterminated string literal");
      } else if (ch >= '0' && ch <= '9') {
        size_t q = p;
        bool is_float = false;
        while (q < src_.size() &&
               (std::isdigit(static_cast<unsigned char>(src_[q])) ||
                src_[q] == '_')) {
          ++q;
        }
        if (q + 1 < src_.size() && src_[q] == '.' &&
            std::isdigit(static_cast<unsigned char>(src_[q + 1]))) {
          is_float = true;
          ++q;
          while (q < src_.size() &&
                 std::isdigit(static_cast<unsigned char>(src_[q]))) {
            ++q;
          }
        }
        if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
          size_t r = q + 1;
          if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
          if (r < src_.size() &&
              std::isdigit(static_cast<unsigned char>(src_[r]))) {
            is_float = true;
            q = r;
            while (q < src_.size() &&
                   std::isdigit(static_cast<unsigned char>(src_[q]))) {
              ++q;
            }
          }
        }
        std::string text;
        for (size_t k = p; k < q; ++k) {
          if (src_[k] != '_') text += src_[k];
        }
        if (is_float) {
          t.k = Tok::K::kFloat;
          t.f = std::strtod(text.c_str(), nullptr);
        } else {
          t.k = Tok::K::kInt;
          auto r = std::from_chars(text.data(), text.data() + text.size(), t.i);
          if (r.ec != std::errc()) {
            return ErrorAt(t.pos, "integer literal out of range");
          }
        }
        t.s = text;
        p = q;
      } else if (IsAlpha(ch) || ch == '_') {
        t.k = Tok::K::kName;
        size_t q = p;
        while (q < src_.size() &&
               (IsAlpha(src_[q]) || src_[q] == '_' ||
                std::isdigit(static_cast<unsigned char>(src_[q])))) {
          ++q;
        }
        t.s = src_.substr(p, q - p);
        p = q;
      } else {
        t.k = Tok::K::kOp;
        static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        for (const char* op : kTwo) {
          if (src_.compare(p, 2, op) == 0) t.s = op;
        }
        if (t.s.empty()) {
          if (std::string_view("+-*/%~<>=()[]{}.,:|").find(ch) ==
              std::string_view::npos) {
            return ErrorAt(t.pos,
                           "unexpected character '" + std::string(1, ch) + "'");
          }
          t.s = std::string(1, ch);
          if (ch == '(' || ch == '[' || ch == '{') ++depth;
          if ((ch == ')' || ch == ']' || ch == '}') && depth > 0) --depth;
        }
        p += t.s.size();
      }
      c->toks.push_back(std::move(t));
    }
  }

  // trim_blocks, lstrip_blocks and `-` markers, as jinja2's lexer applies
  // them.
  static void ApplyWhitespaceControl(std::vector<Chunk>* chunks) {
    auto is_block = [](const Chunk& c) {
      return c.k == Chunk::K::kStmt || c.k == Chunk::K::kComment;
    };
    for (size_t k = 0; k < chunks->size(); ++k) {
      Chunk& c = (*chunks)[k];
      if (c.k != Chunk::K::kText) continue;
      bool line_start = k == 0;
      if (k > 0) {
        const Chunk& prev = (*chunks)[k - 1];
        if (prev.strip_after) {
          size_t b = 0;
          while (b < c.text.size() && IsPySpace(c.text[b])) ++b;
          line_start = b > 0 && c.text[b - 1] == '\n';
          c.text.erase(0, b);
        } else if (is_block(prev) && !prev.raw_begin && !c.text.empty() &&
                   c.text[0] == '\n') {
          c.text.erase(0, 1);
          line_start = true;
        }
      }
      if (k + 1 < chunks->size()) {
        const Chunk& next = (*chunks)[k + 1];
        if (next.strip_before) {
          size_t e = c.text.size();
          while (e > 0 && IsPySpace(c.text[e - 1])) --e;
          c.text.resize(e);
        } else if (is_block(next) && !next.no_lstrip) {
          const size_t nl = c.text.rfind('\n');
          const size_t from = nl == std::string::npos ? 0 : nl + 1;
          if (nl != std::string::npos || line_start) {
            bool all_space = true;
            for (size_t q = from; q < c.text.size(); ++q) {
              if (!IsPySpace(c.text[q])) all_space = false;
            }
            if (all_space) c.text.resize(from);
          }
        }
      }
    }
  }

  std::string src_;
  std::vector<size_t> line_starts_;
};

// ------------------------------------------------------------------- AST

struct Expr {
  enum class K {
    kLiteral,
    kName,
    kList,
    kDict,    // args: key, value, key, value...
    kAttr,    // args[0].name
    kItem,    // args[0][args[1]]
    kSlice,   // args[0][args[1]:args[2]:args[3]] (null parts allowed)
    kCall,    // args[0](args[1:]) with kw names
    kFilter,  // args[0] | name(args[1:])
    kTest,    // args[0] is [not] name(args[1:])
    kNot,
    kNeg,
    kPos,
    kBinary,  // name = operator
    kAnd,
    kOr,
    kCond,  // args: cond, then, else (else may be null)
  };
  K k = K::kLiteral;
  Pos pos;
  std::string name;
  Value lit;
  std::vector<std::unique_ptr<Expr>> args;
  std::vector<std::string> kw;  // per args[1:], "" for positional
  bool negate = false;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class K {
    kText,
    kOutput,
    kIf,
    kFor,
    kSet,
    kSetBlock,
    kMacro,
    kBreak,
    kContinue,
    kBlock
  };
  K k = K::kText;
  Pos pos;
  std::string text;                // text; set / macro name
  std::string attr;                // `set ns.attr`
  std::vector<std::string> names;  // for / set targets; macro params
  std::vector<ExprPtr> exprs;      // if conds; for: iter, filter; set value;
                                   // macro defaults (null when none)
  std::vector<Body> bodies;        // if: per cond + else; for: body, else
};

// --------------------------------------------------------------- Parser

class ExprParser {
 public:
  ExprParser(const std::vector<Tok>& toks, size_t start, Pos tag_end)
      : t_(toks), p_(start), end_pos_(tag_end) {}

  size_t pos() const { return p_; }
  bool AtEnd() const { return p_ >= t_.size(); }
  bool PeekName(std::string_view n, size_t ahead = 0) const {
    return p_ + ahead < t_.size() && t_[p_ + ahead].k == Tok::K::kName &&
           t_[p_ + ahead].s == n;
  }
  bool PeekOp(std::string_view o) const {
    return p_ < t_.size() && t_[p_].k == Tok::K::kOp && t_[p_].s == o;
  }
  Pos Here() const { return AtEnd() ? end_pos_ : t_[p_].pos; }
  std::string Describe() const {
    if (AtEnd()) return "end of tag";
    return "'" + t_[p_].s + "'";
  }
  Status Expect(std::string_view op) {
    if (!PeekOp(op)) {
      return ErrorAt(Here(),
                     "expected '" + std::string(op) + "', got " + Describe());
    }
    ++p_;
    return Status::Ok();
  }
  StatusOr<std::string> ExpectName() {
    if (AtEnd() || t_[p_].k != Tok::K::kName) {
      return ErrorAt(Here(), "expected a name, got " + Describe());
    }
    return t_[p_++].s;
  }
  Status ExpectEnd() {
    if (!AtEnd()) return ErrorAt(Here(), "unexpected " + Describe());
    return Status::Ok();
  }
  void Skip() { ++p_; }

  StatusOr<ExprPtr> ParseExpr(bool allow_cond = true) {
    DepthGuard g(this);
    if (depth_ > kMaxExprDepth) {
      return ErrorAt(Here(), "expression nested too deeply");
    }
    ASSIGN_OR_RETURN(ExprPtr left, ParseOr());
    if (allow_cond && PeekName("if")) {
      const Pos pos = Here();
      ++p_;
      ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
      ExprPtr other;
      if (PeekName("else")) {
        ++p_;
        ASSIGN_OR_RETURN(other, ParseExpr());
      }
      auto e = Make(Expr::K::kCond, pos);
      e->args.push_back(std::move(cond));
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(other));
      return e;
    }
    return left;
  }

  // A tuple without parentheses (`for` iterables): `a, b` -> list.
  StatusOr<ExprPtr> ParseTupleOrExpr() {
    ASSIGN_OR_RETURN(ExprPtr first, ParseExpr());
    if (!PeekOp(",")) return first;
    auto e = Make(Expr::K::kList, first->pos);
    e->name = "tuple";
    e->args.push_back(std::move(first));
    while (PeekOp(",")) {
      ++p_;
      if (AtEnd()) break;
      ASSIGN_OR_RETURN(ExprPtr x, ParseExpr());
      e->args.push_back(std::move(x));
    }
    return e;
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(ExprParser* p) : p(p) { ++p->depth_; }
    ~DepthGuard() { --p->depth_; }
    ExprParser* p;
  };

  static ExprPtr Make(Expr::K k, Pos pos) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->pos = pos;
    return e;
  }
  static ExprPtr Binary(std::string op, Pos pos, ExprPtr a, ExprPtr b) {
    auto e = Make(Expr::K::kBinary, pos);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  StatusOr<ExprPtr> ParseOr() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (PeekName("or")) {
      const Pos pos = Here();
      ++p_;
      ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      auto e = Make(Expr::K::kOr, pos);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }
  StatusOr<ExprPtr> ParseAnd() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (PeekName("and")) {
      const Pos pos = Here();
      ++p_;
      ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      auto e = Make(Expr::K::kAnd, pos);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }
  StatusOr<ExprPtr> ParseNot() {
    if (PeekName("not")) {
      DepthGuard g(this);
      if (depth_ > kMaxExprDepth) {
        return ErrorAt(Here(), "expression nested too deeply");
      }
      const Pos pos = Here();
      ++p_;
      ASSIGN_OR_RETURN(ExprPtr x, ParseNot());
      auto e = Make(Expr::K::kNot, pos);
      e->args.push_back(std::move(x));
      return e;
    }
    return ParseCompare();
  }
  StatusOr<ExprPtr> ParseCompare() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseMath1());
    while (true) {
      const Pos pos = Here();
      std::string op;
      if (!AtEnd() && t_[p_].k == Tok::K::kOp &&
          (t_[p_].s == "==" || t_[p_].s == "!=" || t_[p_].s == "<" ||
           t_[p_].s == ">" || t_[p_].s == "<=" || t_[p_].s == ">=")) {
        op = t_[p_].s;
        ++p_;
      } else if (PeekName("in")) {
        op = "in";
        ++p_;
      } else if (PeekName("not") && PeekName("in", 1)) {
        op = "not in";
        p_ += 2;
      } else {
        break;
      }
      ASSIGN_OR_RETURN(ExprPtr right, ParseMath1());
      left = Binary(op, pos, std::move(left), std::move(right));
    }
    return left;
  }
  StatusOr<ExprPtr> ParseMath1() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    while (PeekOp("+") || PeekOp("-")) {
      const Pos pos = Here();
      const std::string op = t_[p_++].s;
      ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      left = Binary(op, pos, std::move(left), std::move(right));
    }
    return left;
  }
  StatusOr<ExprPtr> ParseConcat() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseMath2());
    while (PeekOp("~")) {
      const Pos pos = Here();
      ++p_;
      ASSIGN_OR_RETURN(ExprPtr right, ParseMath2());
      left = Binary("~", pos, std::move(left), std::move(right));
    }
    return left;
  }
  StatusOr<ExprPtr> ParseMath2() {
    ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
    while (PeekOp("*") || PeekOp("/") || PeekOp("//") || PeekOp("%")) {
      const Pos pos = Here();
      const std::string op = t_[p_++].s;
      ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      left = Binary(op, pos, std::move(left), std::move(right));
    }
    return left;
  }
  StatusOr<ExprPtr> ParsePow() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
    while (PeekOp("**")) {
      const Pos pos = Here();
      ++p_;
      ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      left = Binary("**", pos, std::move(left), std::move(right));
    }
    return left;
  }
  StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard g(this);
    if (depth_ > kMaxExprDepth) {
      return ErrorAt(Here(), "expression nested too deeply");
    }
    ExprPtr node;
    if (PeekOp("-") || PeekOp("+")) {
      const Pos pos = Here();
      const bool neg = t_[p_].s == "-";
      ++p_;
      ASSIGN_OR_RETURN(ExprPtr x, ParseUnary(false));
      node = Make(neg ? Expr::K::kNeg : Expr::K::kPos, pos);
      node->args.push_back(std::move(x));
    } else {
      ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (!with_filter) return node;
    while (true) {
      if (PeekOp("|")) {
        ++p_;
        const Pos pos = Here();
        ASSIGN_OR_RETURN(std::string name, ExpectName());
        auto f = Make(Expr::K::kFilter, pos);
        f->name = name;
        f->args.push_back(std::move(node));
        if (PeekOp("(")) RETURN_IF_ERROR(ParseArgs(f.get()));
        node = std::move(f);
      } else if (PeekName("is")) {
        ++p_;
        auto t = Make(Expr::K::kTest, Here());
        if (PeekName("not")) {
          t->negate = true;
          ++p_;
        }
        t->pos = Here();
        if (PeekName("none") || PeekName("true") || PeekName("false")) {
          t->name = t_[p_++].s;
        } else {
          ASSIGN_OR_RETURN(t->name, ExpectName());
        }
        t->args.push_back(std::move(node));
        static const char* kArgTests[] = {
            "divisibleby", "eq", "equalto", "ne", "lt",          "le",
            "gt",          "ge", "sameas",  "in", "greaterthan", "lessthan"};
        const bool takes_arg =
            std::find_if(std::begin(kArgTests), std::end(kArgTests),
                         [&](const char* n) { return t->name == n; }) !=
            std::end(kArgTests);
        if (PeekOp("(")) {
          RETURN_IF_ERROR(ParseArgs(t.get()));
        } else if (takes_arg && !AtEnd()) {
          ASSIGN_OR_RETURN(ExprPtr arg, ParseUnary(false));
          t->args.push_back(std::move(arg));
          t->kw.push_back("");
        }
        node = std::move(t);
      } else if (PeekOp("(")) {
        auto c = Make(Expr::K::kCall, node->pos);
        c->args.push_back(std::move(node));
        RETURN_IF_ERROR(ParseArgs(c.get()));
        node = std::move(c);
      } else {
        break;
      }
    }
    return node;
  }

  // `(a, b, k=v)` appended to e->args[1:] / e->kw.
  Status ParseArgs(Expr* e) {
    RETURN_IF_ERROR(Expect("("));
    while (!PeekOp(")")) {
      if (AtEnd()) return ErrorAt(Here(), "unterminated argument list");
      if (PeekOp("*") || PeekOp("**")) {
        return ErrorAt(Here(), "unsupported syntax: '*args' / '**kwargs'");
      }
      std::string kw;
      if (!AtEnd() && t_[p_].k == Tok::K::kName && p_ + 1 < t_.size() &&
          t_[p_ + 1].k == Tok::K::kOp && t_[p_ + 1].s == "=") {
        kw = t_[p_].s;
        p_ += 2;
      }
      ASSIGN_OR_RETURN(ExprPtr a, ParseExpr());
      e->args.push_back(std::move(a));
      e->kw.push_back(kw);
      if (PeekOp(",")) {
        ++p_;
      } else if (!PeekOp(")")) {
        return ErrorAt(Here(), "expected ',' or ')', got " + Describe());
      }
    }
    ++p_;
    return Status::Ok();
  }

  StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      if (PeekOp(".")) {
        ++p_;
        const Pos pos = Here();
        if (!AtEnd() && t_[p_].k == Tok::K::kInt) {
          auto e = Make(Expr::K::kItem, pos);
          e->args.push_back(std::move(node));
          auto idx = Make(Expr::K::kLiteral, pos);
          idx->lit = Value::Int(t_[p_++].i);
          e->args.push_back(std::move(idx));
          node = std::move(e);
          continue;
        }
        ASSIGN_OR_RETURN(std::string name, ExpectName());
        auto e = Make(Expr::K::kAttr, pos);
        e->name = name;
        e->args.push_back(std::move(node));
        node = std::move(e);
      } else if (PeekOp("[")) {
        const Pos pos = Here();
        ++p_;
        ExprPtr parts[3];
        int part = 0;
        bool is_slice = false;
        while (!PeekOp("]")) {
          if (AtEnd()) return ErrorAt(pos, "unterminated '['");
          if (PeekOp(":")) {
            is_slice = true;
            if (++part > 2) return ErrorAt(Here(), "too many ':' in slice");
            ++p_;
            continue;
          }
          if (parts[part]) {
            return ErrorAt(Here(), "expected ']' or ':', got " + Describe());
          }
          ASSIGN_OR_RETURN(parts[part], ParseExpr());
        }
        ++p_;
        auto e = Make(is_slice ? Expr::K::kSlice : Expr::K::kItem, pos);
        e->args.push_back(std::move(node));
        if (is_slice) {
          for (auto& x : parts) e->args.push_back(std::move(x));
        } else {
          if (!parts[0]) return ErrorAt(pos, "empty subscript '[]'");
          e->args.push_back(std::move(parts[0]));
        }
        node = std::move(e);
      } else if (PeekOp("(")) {
        auto c = Make(Expr::K::kCall, node->pos);
        c->args.push_back(std::move(node));
        RETURN_IF_ERROR(ParseArgs(c.get()));
        node = std::move(c);
      } else {
        return node;
      }
    }
  }

  StatusOr<ExprPtr> ParsePrimary() {
    if (AtEnd())
      return ErrorAt(Here(), "expected an expression, got end of tag");
    const Tok& t = t_[p_];
    const Pos pos = t.pos;
    auto lit = [&](Value v) {
      auto e = Make(Expr::K::kLiteral, pos);
      e->lit = std::move(v);
      return e;
    };
    switch (t.k) {
      case Tok::K::kName: {
        ++p_;
        if (t.s == "true" || t.s == "True") return lit(Value::Bool(true));
        if (t.s == "false" || t.s == "False") return lit(Value::Bool(false));
        if (t.s == "none" || t.s == "None") return lit(Value::None());
        auto e = Make(Expr::K::kName, pos);
        e->name = t.s;
        return e;
      }
      case Tok::K::kString: {
        std::string s;
        while (!AtEnd() && t_[p_].k == Tok::K::kString) s += t_[p_++].s;
        return lit(Value::Str(std::move(s)));
      }
      case Tok::K::kInt:
        ++p_;
        return lit(Value::Int(t.i));
      case Tok::K::kFloat:
        ++p_;
        return lit(Value::Float(t.f));
      case Tok::K::kOp:
        break;
    }
    if (t.s == "(") {
      ++p_;
      if (PeekOp(")")) {
        ++p_;
        auto e = Make(Expr::K::kList, pos);
        e->name = "tuple";
        return e;
      }
      ASSIGN_OR_RETURN(ExprPtr first, ParseExpr());
      if (PeekOp(")")) {
        ++p_;
        return first;
      }
      auto e = Make(Expr::K::kList, pos);
      e->name = "tuple";
      e->args.push_back(std::move(first));
      while (PeekOp(",")) {
        ++p_;
        if (PeekOp(")")) break;
        ASSIGN_OR_RETURN(ExprPtr x, ParseExpr());
        e->args.push_back(std::move(x));
      }
      RETURN_IF_ERROR(Expect(")"));
      return e;
    }
    if (t.s == "[") {
      ++p_;
      auto e = Make(Expr::K::kList, pos);
      while (!PeekOp("]")) {
        if (AtEnd()) return ErrorAt(pos, "unterminated '['");
        ASSIGN_OR_RETURN(ExprPtr x, ParseExpr());
        e->args.push_back(std::move(x));
        if (PeekOp(",")) {
          ++p_;
        } else if (!PeekOp("]")) {
          return ErrorAt(Here(), "expected ',' or ']', got " + Describe());
        }
      }
      ++p_;
      return e;
    }
    if (t.s == "{") {
      ++p_;
      auto e = Make(Expr::K::kDict, pos);
      while (!PeekOp("}")) {
        if (AtEnd()) return ErrorAt(pos, "unterminated '{'");
        ASSIGN_OR_RETURN(ExprPtr k, ParseExpr());
        RETURN_IF_ERROR(Expect(":"));
        ASSIGN_OR_RETURN(ExprPtr v, ParseExpr());
        e->args.push_back(std::move(k));
        e->args.push_back(std::move(v));
        if (PeekOp(",")) {
          ++p_;
        } else if (!PeekOp("}")) {
          return ErrorAt(Here(), "expected ',' or '}', got " + Describe());
        }
      }
      ++p_;
      return e;
    }
    return ErrorAt(pos, "unexpected '" + t.s + "'");
  }

  const std::vector<Tok>& t_;
  size_t p_;
  Pos end_pos_;
  int depth_ = 0;
};

class Parser {
 public:
  explicit Parser(std::vector<Chunk> chunks) : chunks_(std::move(chunks)) {}

  StatusOr<Body> ParseAll() {
    std::string ender;
    ASSIGN_OR_RETURN(Body body, ParseBody({}, &ender, Pos{}, ""));
    return body;
  }

 private:
  static std::string TagName(const Chunk& c) {
    if (c.toks.empty() || c.toks[0].k != Tok::K::kName) return "";
    return c.toks[0].s;
  }

  // Parses nodes until one of `enders` (a block tag name); the ender chunk
  // is left at chunks_[i_ - 1].
  StatusOr<Body> ParseBody(std::vector<std::string> enders, std::string* ender,
                           Pos opened, std::string_view opener) {
    if (++depth_ > kMaxParseDepth) {
      return ErrorAt(opened, "blocks nested too deeply");
    }
    Body body;
    while (i_ < chunks_.size()) {
      const Chunk& c = chunks_[i_++];
      switch (c.k) {
        case Chunk::K::kComment:
          continue;
        case Chunk::K::kText: {
          if (c.text.empty()) continue;
          auto n = std::make_unique<Node>();
          n->k = Node::K::kText;
          n->pos = c.pos;
          n->text = c.text;
          body.push_back(std::move(n));
          continue;
        }
        case Chunk::K::kExpr: {
          if (c.toks.empty()) return ErrorAt(c.pos, "empty expression '{{ }}'");
          ExprParser ep(c.toks, 0, c.end_pos);
          ASSIGN_OR_RETURN(ExprPtr e, ep.ParseExpr());
          RETURN_IF_ERROR(ep.ExpectEnd());
          auto n = std::make_unique<Node>();
          n->k = Node::K::kOutput;
          n->pos = c.pos;
          n->exprs.push_back(std::move(e));
          body.push_back(std::move(n));
          continue;
        }
        case Chunk::K::kStmt:
          break;
      }
      const std::string name = TagName(c);
      if (name.empty()) return ErrorAt(c.pos, "expected a tag name after '{%'");
      if (std::find(enders.begin(), enders.end(), name) != enders.end()) {
        *ender = name;
        --depth_;
        return body;
      }
      ASSIGN_OR_RETURN(auto node, ParseStatement(c, name));
      if (node) body.push_back(std::move(node));
    }
    if (!enders.empty()) {
      return ErrorAt(opened, "missing {% " + enders.back() + " %} for '" +
                                 std::string(opener) + "' opened here");
    }
    --depth_;
    return body;
  }

  StatusOr<std::unique_ptr<Node>> ParseStatement(const Chunk& c,
                                                 const std::string& name) {
    auto n = std::make_unique<Node>();
    n->pos = c.pos;
    ExprParser ep(c.toks, 1, c.end_pos);
    if (name == "if") {
      n->k = Node::K::kIf;
      ASSIGN_OR_RETURN(ExprPtr cond, ep.ParseExpr());
      RETURN_IF_ERROR(ep.ExpectEnd());
      n->exprs.push_back(std::move(cond));
      while (true) {
        std::string ender;
        ASSIGN_OR_RETURN(
            Body b, ParseBody({"elif", "else", "endif"}, &ender, c.pos, "if"));
        n->bodies.push_back(std::move(b));
        const Chunk& ec = chunks_[i_ - 1];
        ExprParser ee(ec.toks, 1, ec.end_pos);
        if (ender == "endif") {
          RETURN_IF_ERROR(ee.ExpectEnd());
          break;
        }
        if (ender == "elif") {
          ASSIGN_OR_RETURN(ExprPtr x, ee.ParseExpr());
          RETURN_IF_ERROR(ee.ExpectEnd());
          n->exprs.push_back(std::move(x));
          continue;
        }
        RETURN_IF_ERROR(ee.ExpectEnd());
        ASSIGN_OR_RETURN(Body eb, ParseBody({"endif"}, &ender, c.pos, "if"));
        n->bodies.push_back(std::move(eb));
        const Chunk& endc = chunks_[i_ - 1];
        ExprParser ed(endc.toks, 1, endc.end_pos);
        RETURN_IF_ERROR(ed.ExpectEnd());
        break;
      }
      return n;
    }
    if (name == "for") {
      n->k = Node::K::kFor;
      while (true) {
        ASSIGN_OR_RETURN(std::string target, ep.ExpectName());
        n->names.push_back(target);
        if (!ep.PeekOp(",")) break;
        ep.Skip();
      }
      if (!ep.PeekName("in")) {
        return ErrorAt(ep.Here(), "expected 'in' in for, got " + ep.Describe());
      }
      ep.Skip();
      // The iterable stops before a filtering `if`.
      ASSIGN_OR_RETURN(ExprPtr iter, ep.ParseExpr(/*allow_cond=*/false));
      n->exprs.push_back(std::move(iter));
      if (ep.PeekName("if")) {
        ep.Skip();
        ASSIGN_OR_RETURN(ExprPtr filt, ep.ParseExpr(false));
        n->exprs.push_back(std::move(filt));
      } else {
        n->exprs.push_back(nullptr);
      }
      if (ep.PeekName("recursive")) {
        return ErrorAt(ep.Here(), "unsupported: recursive for loops");
      }
      RETURN_IF_ERROR(ep.ExpectEnd());
      ++loop_depth_;
      std::string ender;
      ASSIGN_OR_RETURN(Body b,
                       ParseBody({"else", "endfor"}, &ender, c.pos, "for"));
      --loop_depth_;
      n->bodies.push_back(std::move(b));
      if (ender == "else") {
        ASSIGN_OR_RETURN(Body eb, ParseBody({"endfor"}, &ender, c.pos, "for"));
        n->bodies.push_back(std::move(eb));
      } else {
        n->bodies.emplace_back();
      }
      return n;
    }
    if (name == "set") {
      ASSIGN_OR_RETURN(std::string target, ep.ExpectName());
      n->text = target;
      if (ep.PeekOp(".")) {
        ep.Skip();
        ASSIGN_OR_RETURN(n->attr, ep.ExpectName());
      } else {
        n->names.push_back(target);
        while (ep.PeekOp(",")) {
          ep.Skip();
          ASSIGN_OR_RETURN(std::string more, ep.ExpectName());
          n->names.push_back(more);
        }
      }
      if (ep.AtEnd()) {
        if (!n->attr.empty() || n->names.size() != 1) {
          return ErrorAt(ep.Here(), "block set takes a single name");
        }
        n->k = Node::K::kSetBlock;
        std::string ender;
        ASSIGN_OR_RETURN(Body b, ParseBody({"endset"}, &ender, c.pos, "set"));
        n->bodies.push_back(std::move(b));
        return n;
      }
      n->k = Node::K::kSet;
      RETURN_IF_ERROR(ep.Expect("="));
      ASSIGN_OR_RETURN(ExprPtr v, ep.ParseTupleOrExpr());
      RETURN_IF_ERROR(ep.ExpectEnd());
      n->exprs.push_back(std::move(v));
      return n;
    }
    if (name == "macro") {
      n->k = Node::K::kMacro;
      ASSIGN_OR_RETURN(n->text, ep.ExpectName());
      RETURN_IF_ERROR(ep.Expect("("));
      while (!ep.PeekOp(")")) {
        ASSIGN_OR_RETURN(std::string param, ep.ExpectName());
        n->names.push_back(param);
        if (ep.PeekOp("=")) {
          ep.Skip();
          ASSIGN_OR_RETURN(ExprPtr d, ep.ParseExpr());
          n->exprs.push_back(std::move(d));
        } else {
          n->exprs.push_back(nullptr);
        }
        if (ep.PeekOp(",")) {
          ep.Skip();
        } else if (!ep.PeekOp(")")) {
          return ErrorAt(ep.Here(),
                         "expected ',' or ')', got " + ep.Describe());
        }
      }
      ep.Skip();
      RETURN_IF_ERROR(ep.ExpectEnd());
      const int saved_loops = loop_depth_;
      loop_depth_ = 0;
      std::string ender;
      ASSIGN_OR_RETURN(Body b, ParseBody({"endmacro"}, &ender, c.pos, "macro"));
      loop_depth_ = saved_loops;
      n->bodies.push_back(std::move(b));
      return n;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) {
        return ErrorAt(c.pos, "'" + name + "' outside a for loop");
      }
      RETURN_IF_ERROR(ep.ExpectEnd());
      n->k = name == "break" ? Node::K::kBreak : Node::K::kContinue;
      return n;
    }
    if (name == "generation") {  // transformers' AssistantTracker block.
      RETURN_IF_ERROR(ep.ExpectEnd());
      n->k = Node::K::kBlock;
      std::string ender;
      ASSIGN_OR_RETURN(
          Body b, ParseBody({"endgeneration"}, &ender, c.pos, "generation"));
      n->bodies.push_back(std::move(b));
      return n;
    }
    if (name == "raw") {
      // The lexer made the content a text chunk; skip the endraw tag.
      std::string ender;
      ASSIGN_OR_RETURN(Body b, ParseBody({"endraw"}, &ender, c.pos, "raw"));
      n->k = Node::K::kBlock;
      n->bodies.push_back(std::move(b));
      return n;
    }
    static const char* kEnders[] = {"elif",   "else",         "endif",
                                    "endfor", "endmacro",     "endset",
                                    "endraw", "endgeneration"};
    for (const char* e : kEnders) {
      if (name == e) return ErrorAt(c.pos, "unexpected '" + name + "'");
    }
    static const char* kUnsupported[] = {
        "call",  "filter", "include", "import", "from",       "extends",
        "block", "with",   "do",      "trans",  "autoescape", "endcall"};
    for (const char* u : kUnsupported) {
      if (name == u) {
        return ErrorAt(c.pos, "unsupported tag '" + name + "'");
      }
    }
    return ErrorAt(c.pos, "unknown tag '" + name + "'");
  }

  std::vector<Chunk> chunks_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

struct ChatTemplateProgram {
  std::string source;
  Body body;
};

namespace {

// ------------------------------------------------------------- Evaluator

struct Frame {
  std::unordered_map<std::string, Value> vars;
  Frame* parent = nullptr;
  const Value* Find(const std::string& name) const {
    for (const Frame* f = this; f != nullptr; f = f->parent) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { kNormal, kBreak, kContinue };

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Positional `idx` or keyword `name`, else `def`.
  Value Get(size_t idx, std::string_view name, Value def = Value()) const {
    if (idx < pos.size()) return pos[idx];
    for (const auto& [k, v] : kw) {
      if (k == name) return v;
    }
    return def;
  }
};

class Renderer {
 public:
  Renderer(Frame* globals, std::optional<int64_t> now)
      : globals_(globals), now_(now) {}

  Status Exec(const Body& body, Frame* f, std::string* out, Flow* flow) {
    Guard g(this);
    if (depth_ > kMaxEvalDepth) {
      return ErrorAt(body.empty() ? Pos{} : body[0]->pos, "recursion too deep");
    }
    for (const auto& n : body) {
      RETURN_IF_ERROR(ExecNode(*n, f, out, flow));
      if (out->size() > kMaxOutputBytes) {
        return ErrorAt(n->pos, "output larger than 64 MiB");
      }
      if (*flow != Flow::kNormal) return Status::Ok();
    }
    return Status::Ok();
  }

 private:
  struct Guard {
    explicit Guard(Renderer* r) : r(r) { ++r->depth_; }
    ~Guard() { --r->depth_; }
    Renderer* r;
  };

  Status ExecNode(const Node& n, Frame* f, std::string* out, Flow* flow) {
    switch (n.k) {
      case Node::K::kText:
        *out += n.text;
        return Status::Ok();
      case Node::K::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*n.exprs[0], f));
        *out += ToStr(v);
        return Status::Ok();
      }
      case Node::K::kIf:
        for (size_t k = 0; k < n.exprs.size(); ++k) {
          ASSIGN_OR_RETURN(Value c, Eval(*n.exprs[k], f));
          if (Truthy(c)) return Exec(n.bodies[k], f, out, flow);
        }
        if (n.bodies.size() > n.exprs.size()) {
          return Exec(n.bodies.back(), f, out, flow);
        }
        return Status::Ok();
      case Node::K::kFor:
        return ExecFor(n, f, out);
      case Node::K::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*n.exprs[0], f));
        return Assign(n, f, std::move(v));
      }
      case Node::K::kSetBlock: {
        std::string captured;
        Flow inner = Flow::kNormal;
        RETURN_IF_ERROR(Exec(n.bodies[0], f, &captured, &inner));
        return Assign(n, f, Value::Str(std::move(captured)));
      }
      case Node::K::kMacro: {
        Value m;
        m.t = Value::T::kMacro;
        m.macro = &n;
        m.s = n.text;
        f->vars[n.text] = m;
        return Status::Ok();
      }
      case Node::K::kBreak:
        *flow = Flow::kBreak;
        return Status::Ok();
      case Node::K::kContinue:
        *flow = Flow::kContinue;
        return Status::Ok();
      case Node::K::kBlock:
        return Exec(n.bodies[0], f, out, flow);
    }
    return Status::Ok();
  }

  Status Assign(const Node& n, Frame* f, Value v) {
    if (ValueDepth(v, kMaxValueDepth) > kMaxValueDepth) {
      return ErrorAt(n.pos,
                     "value nested too deeply (or a namespace that "
                     "contains itself)");
    }
    if (!n.attr.empty()) {
      const Value* ns = f->Find(n.text);
      if (ns == nullptr || ns->t != Value::T::kNamespace) {
        return ErrorAt(n.pos, "cannot assign attribute '" + n.attr +
                                  "' on non-namespace '" + n.text + "'");
      }
      ns->dict->Set(n.attr, std::move(v));
      if (ValueDepth(*ns, kMaxValueDepth) > kMaxValueDepth) {
        // Break the cycle (or over-deep value) before reporting it.
        auto& items = ns->dict->items;
        items.erase(
            std::remove_if(items.begin(), items.end(),
                           [&](const auto& kv) { return kv.first == n.attr; }),
            items.end());
        return ErrorAt(n.pos,
                       "value nested too deeply (or a namespace that "
                       "contains itself)");
      }
      return Status::Ok();
    }
    if (n.names.size() == 1) {
      f->vars[n.names[0]] = std::move(v);
      return Status::Ok();
    }
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v, n.pos));
    if (items.size() != n.names.size()) {
      return ErrorAt(n.pos, "cannot unpack " + std::to_string(items.size()) +
                                " values into " +
                                std::to_string(n.names.size()) + " names");
    }
    for (size_t k = 0; k < items.size(); ++k) f->vars[n.names[k]] = items[k];
    return Status::Ok();
  }

  StatusOr<std::vector<Value>> Iterate(const Value& v, Pos pos) {
    switch (v.t) {
      case Value::T::kUndefined:
        return std::vector<Value>{};
      case Value::T::kList:
        return *v.list;
      case Value::T::kDict: {
        std::vector<Value> keys;
        for (const auto& [k, e] : v.dict->items) keys.push_back(Value::Str(k));
        return keys;
      }
      case Value::T::kString: {
        std::vector<Value> chars;
        const std::vector<size_t> cp = CodePoints(v.s);
        for (size_t k = 0; k + 1 < cp.size(); ++k) {
          chars.push_back(Value::Str(v.s.substr(cp[k], cp[k + 1] - cp[k])));
        }
        return chars;
      }
      default:
        return ErrorAt(
            pos, std::string("'") + TypeName(v) + "' object is not iterable");
    }
  }

  Status ExecFor(const Node& n, Frame* f, std::string* out) {
    ASSIGN_OR_RETURN(Value seq, Eval(*n.exprs[0], f));
    ASSIGN_OR_RETURN(std::vector<Value> all, Iterate(seq, n.exprs[0]->pos));
    Frame frame;
    frame.parent = f;
    std::vector<Value> items;
    auto bind = [&](Frame* fr, const Value& item) -> Status {
      if (n.names.size() == 1) {
        fr->vars[n.names[0]] = item;
        return Status::Ok();
      }
      ASSIGN_OR_RETURN(std::vector<Value> parts, Iterate(item, n.pos));
      if (parts.size() != n.names.size()) {
        return ErrorAt(n.pos, "cannot unpack " + std::to_string(parts.size()) +
                                  " values into " +
                                  std::to_string(n.names.size()) + " names");
      }
      for (size_t k = 0; k < parts.size(); ++k) {
        fr->vars[n.names[k]] = parts[k];
      }
      return Status::Ok();
    };
    if (n.exprs[1]) {
      for (const Value& item : all) {
        RETURN_IF_ERROR(CountIteration(n.pos));
        Frame tmp;
        tmp.parent = f;
        RETURN_IF_ERROR(bind(&tmp, item));
        ASSIGN_OR_RETURN(Value keep, Eval(*n.exprs[1], &tmp));
        if (Truthy(keep)) items.push_back(item);
      }
    } else {
      items = std::move(all);
    }
    if (items.empty()) {
      Flow flow = Flow::kNormal;
      return Exec(n.bodies[1], f, out, &flow);
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      RETURN_IF_ERROR(CountIteration(n.pos));
      frame.vars.clear();
      RETURN_IF_ERROR(bind(&frame, items[k]));
      Value loop = Value::Dict();
      DictData& d = *loop.dict;
      d.Set("index", Value::Int(k + 1));
      d.Set("index0", Value::Int(k));
      d.Set("revindex", Value::Int(len - k));
      d.Set("revindex0", Value::Int(len - k - 1));
      d.Set("first", Value::Bool(k == 0));
      d.Set("last", Value::Bool(k == len - 1));
      d.Set("length", Value::Int(len));
      d.Set("depth", Value::Int(1));
      d.Set("depth0", Value::Int(0));
      if (k > 0) d.Set("previtem", items[k - 1]);
      if (k + 1 < len) d.Set("nextitem", items[k + 1]);
      frame.vars["loop"] = std::move(loop);
      Flow flow = Flow::kNormal;
      RETURN_IF_ERROR(Exec(n.bodies[0], &frame, out, &flow));
      if (flow == Flow::kBreak) break;
    }
    return Status::Ok();
  }

  Status CountIteration(Pos pos) {
    if (++iterations_ > kMaxLoopIterations) {
      return ErrorAt(pos, "more than 1000000 loop iterations");
    }
    return Status::Ok();
  }

  static Status Undefined(Pos pos, const Value& v) {
    return ErrorAt(pos, "'" + (v.s.empty() ? std::string("value") : v.s) +
                            "' is undefined");
  }

  StatusOr<Value> Eval(const Expr& e, Frame* f) {
    Guard g(this);
    if (depth_ > kMaxEvalDepth) return ErrorAt(e.pos, "recursion too deep");
    switch (e.k) {
      case Expr::K::kLiteral:
        return e.lit;
      case Expr::K::kName: {
        const Value* v = f->Find(e.name);
        if (v == nullptr) return Value::Undef(e.name);
        return *v;
      }
      case Expr::K::kList: {
        std::vector<Value> items;
        for (const auto& a : e.args) {
          ASSIGN_OR_RETURN(Value v, Eval(*a, f));
          items.push_back(std::move(v));
        }
        return e.name == "tuple" ? Value::Tuple(std::move(items))
                                 : Value::List(std::move(items));
      }
      case Expr::K::kDict: {
        Value d = Value::Dict();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          ASSIGN_OR_RETURN(Value key, Eval(*e.args[k], f));
          ASSIGN_OR_RETURN(Value v, Eval(*e.args[k + 1], f));
          if (!key.is_str()) {
            return ErrorAt(e.args[k]->pos, "dict keys must be strings");
          }
          d.dict->Set(key.s, std::move(v));
        }
        return d;
      }
      case Expr::K::kAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], f));
        return GetAttr(obj, e.name, e.pos);
      }
      case Expr::K::kItem: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], f));
        ASSIGN_OR_RETURN(Value key, Eval(*e.args[1], f));
        return GetItem(obj, key, e.pos);
      }
      case Expr::K::kSlice:
        return EvalSlice(e, f);
      case Expr::K::kCall:
        return EvalCall(e, f);
      case Expr::K::kFilter: {
        ASSIGN_OR_RETURN(Value subject, Eval(*e.args[0], f));
        ASSIGN_OR_RETURN(Args args, EvalArgs(e, f));
        return ApplyFilter(e.name, subject, args, e.pos);
      }
      case Expr::K::kTest: {
        ASSIGN_OR_RETURN(Value subject, Eval(*e.args[0], f));
        ASSIGN_OR_RETURN(Args args, EvalArgs(e, f));
        ASSIGN_OR_RETURN(bool r, ApplyTest(e.name, subject, args, e.pos));
        return Value::Bool(r != e.negate);
      }
      case Expr::K::kNot: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[0], f));
        return Value::Bool(!Truthy(v));
      }
      case Expr::K::kNeg:
      case Expr::K::kPos: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[0], f));
        if (v.undefined()) return Undefined(e.pos, v);
        if (!v.is_number()) {
          return ErrorAt(e.pos, std::string("bad operand type for unary ") +
                                    (e.k == Expr::K::kNeg ? "-" : "+") + ": '" +
                                    TypeName(v) + "'");
        }
        if (e.k == Expr::K::kPos) {
          return v.t == Value::T::kBool ? Value::Int(v.b) : v;
        }
        if (v.t == Value::T::kFloat) return Value::Float(-v.f);
        if (v.AsInt() == INT64_MIN) return ErrorAt(e.pos, "integer overflow");
        return Value::Int(-v.AsInt());
      }
      case Expr::K::kAnd: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.args[0], f));
        if (!Truthy(a)) return a;
        return Eval(*e.args[1], f);
      }
      case Expr::K::kOr: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.args[0], f));
        if (Truthy(a)) return a;
        return Eval(*e.args[1], f);
      }
      case Expr::K::kCond: {
        ASSIGN_OR_RETURN(Value c, Eval(*e.args[0], f));
        if (Truthy(c)) return Eval(*e.args[1], f);
        if (!e.args[2]) return Value::Undef("");
        return Eval(*e.args[2], f);
      }
      case Expr::K::kBinary: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.args[0], f));
        ASSIGN_OR_RETURN(Value b, Eval(*e.args[1], f));
        return Binary(e.name, a, b, e.pos);
      }
    }
    return ErrorAt(e.pos, "internal: bad expression");
  }

  StatusOr<Value> GetAttr(const Value& obj, const std::string& name, Pos pos) {
    if (obj.undefined()) {
      return ErrorAt(pos, "'" + (obj.s.empty() ? std::string("value") : obj.s) +
                              "' is undefined (reading attribute '" + name +
                              "')");
    }
    if (obj.is_dict() || obj.t == Value::T::kNamespace) {
      const Value* v = obj.dict->Find(name);
      if (v != nullptr) return *v;
    }
    return Value::Undef(name);
  }

  StatusOr<Value> GetItem(const Value& obj, const Value& key, Pos pos) {
    if (obj.undefined()) {
      return ErrorAt(pos, "'" + (obj.s.empty() ? std::string("value") : obj.s) +
                              "' is undefined (subscript)");
    }
    if ((obj.is_dict() || obj.t == Value::T::kNamespace) && key.is_str()) {
      const Value* v = obj.dict->Find(key.s);
      return v != nullptr ? *v : Value::Undef(key.s);
    }
    if ((obj.is_list() || obj.is_str()) &&
        (key.t == Value::T::kInt || key.t == Value::T::kBool)) {
      int64_t idx = key.AsInt();
      if (obj.is_list()) {
        const int64_t n = static_cast<int64_t>(obj.list->size());
        if (idx < 0) idx += n;
        if (idx < 0 || idx >= n) return Value::Undef("");
        return (*obj.list)[idx];
      }
      const std::vector<size_t> cp = CodePoints(obj.s);
      const int64_t n = static_cast<int64_t>(cp.size()) - 1;
      if (idx < 0) idx += n;
      if (idx < 0 || idx >= n) return Value::Undef("");
      return Value::Str(obj.s.substr(cp[idx], cp[idx + 1] - cp[idx]));
    }
    return Value::Undef(key.is_str() ? key.s : "");
  }

  StatusOr<Value> EvalSlice(const Expr& e, Frame* f) {
    ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], f));
    std::optional<int64_t> part[3];
    for (int k = 0; k < 3; ++k) {
      if (!e.args[k + 1]) continue;
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[k + 1], f));
      if (v.t == Value::T::kNone) continue;
      if (v.t != Value::T::kInt && v.t != Value::T::kBool) {
        return ErrorAt(e.args[k + 1]->pos, "slice indices must be integers");
      }
      part[k] = v.AsInt();
    }
    if (obj.undefined()) return Undefined(e.pos, obj);
    const int64_t step = part[2].value_or(1);
    if (step == 0) return ErrorAt(e.pos, "slice step cannot be zero");
    std::vector<size_t> cp;
    int64_t len = 0;
    if (obj.is_list()) {
      len = static_cast<int64_t>(obj.list->size());
    } else if (obj.is_str()) {
      cp = CodePoints(obj.s);
      len = static_cast<int64_t>(cp.size()) - 1;
    } else {
      return ErrorAt(e.pos,
                     std::string("cannot slice '") + TypeName(obj) + "'");
    }
    auto adjust = [&](std::optional<int64_t> x, int64_t def) {
      if (!x) return def;
      int64_t v = *x;
      if (v < 0) {
        v += len;
        if (v < 0) v = step < 0 ? -1 : 0;
      } else if (v >= len) {
        v = step < 0 ? len - 1 : len;
      }
      return v;
    };
    const int64_t start = adjust(part[0], step < 0 ? len - 1 : 0);
    const int64_t stop = adjust(part[1], step < 0 ? -1 : len);
    std::vector<int64_t> idx;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      idx.push_back(k);
    }
    if (obj.is_list()) {
      std::vector<Value> items;
      for (int64_t k : idx) items.push_back((*obj.list)[k]);
      return Value::List(std::move(items));
    }
    std::string s;
    for (int64_t k : idx) s.append(obj.s, cp[k], cp[k + 1] - cp[k]);
    return Value::Str(std::move(s));
  }

  StatusOr<Args> EvalArgs(const Expr& e, Frame* f) {
    Args args;
    for (size_t k = 1; k < e.args.size(); ++k) {
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[k], f));
      const std::string& kw = e.kw[k - 1];
      if (kw.empty()) {
        if (!args.kw.empty()) {
          return ErrorAt(e.args[k]->pos,
                         "positional argument follows keyword argument");
        }
        args.pos.push_back(std::move(v));
      } else {
        args.kw.emplace_back(kw, std::move(v));
      }
    }
    return args;
  }

  StatusOr<Value> EvalCall(const Expr& e, Frame* f) {
    const Expr& callee = *e.args[0];
    ASSIGN_OR_RETURN(Args args, EvalArgs(e, f));
    if (callee.k == Expr::K::kAttr) {
      ASSIGN_OR_RETURN(Value obj, Eval(*callee.args[0], f));
      if (obj.is_dict() || obj.t == Value::T::kNamespace) {
        const Value* member = obj.dict->Find(callee.name);
        if (member != nullptr && (member->t == Value::T::kMacro ||
                                  member->t == Value::T::kBuiltin)) {
          return CallValue(*member, args, e.pos);
        }
      }
      return CallMethod(obj, callee.name, args, callee.pos);
    }
    ASSIGN_OR_RETURN(Value fn, Eval(callee, f));
    if (fn.undefined()) {
      return ErrorAt(callee.pos,
                     "'" + fn.s + "' is undefined (not a function)");
    }
    return CallValue(fn, args, e.pos);
  }

  StatusOr<Value> CallValue(const Value& fn, const Args& args, Pos pos) {
    if (fn.t == Value::T::kMacro) return CallMacro(*fn.macro, args, pos);
    if (fn.t != Value::T::kBuiltin) {
      return ErrorAt(
          pos, std::string("'") + TypeName(fn) + "' object is not callable");
    }
    const std::string& name = fn.s;
    if (name == "raise_exception") {
      return ErrorAt(pos, "raise_exception: " + ToStr(args.Get(0, "message")));
    }
    if (name == "range") {
      std::vector<int64_t> p;
      for (const Value& v : args.pos) {
        if (v.t != Value::T::kInt && v.t != Value::T::kBool) {
          return ErrorAt(pos, "range() arguments must be integers");
        }
        p.push_back(v.AsInt());
      }
      if (p.empty() || p.size() > 3) {
        return ErrorAt(pos, "range() takes 1 to 3 arguments");
      }
      const int64_t start = p.size() == 1 ? 0 : p[0];
      const int64_t stop = p.size() == 1 ? p[0] : p[1];
      const int64_t step = p.size() == 3 ? p[2] : 1;
      if (step == 0) return ErrorAt(pos, "range() step must not be zero");
      std::vector<Value> items;
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
        if (static_cast<int64_t>(items.size()) >= kMaxLoopIterations) {
          return ErrorAt(pos, "range() too large");
        }
        items.push_back(Value::Int(k));
      }
      return Value::List(std::move(items));
    }
    if (name == "namespace" || name == "dict") {
      Value ns = name == "namespace" ? Value::Namespace() : Value::Dict();
      for (const Value& v : args.pos) {
        if (!v.is_dict()) {
          return ErrorAt(pos, name + "() positional argument must be a dict");
        }
        for (const auto& [k, x] : v.dict->items) ns.dict->Set(k, x);
      }
      for (const auto& [k, v] : args.kw) ns.dict->Set(k, v);
      return ns;
    }
    if (name == "strftime_now") {
      const Value fmt = args.Get(0, "format");
      if (!fmt.is_str()) return ErrorAt(pos, "strftime_now() needs a format");
      std::tm tm{};
      if (now_) {
        const std::time_t t = static_cast<std::time_t>(*now_);
        gmtime_r(&t, &tm);
      } else {
        const std::time_t t = std::time(nullptr);
        localtime_r(&t, &tm);
      }
      char buf[512];
      const size_t n = std::strftime(buf, sizeof(buf), fmt.s.c_str(), &tm);
      return Value::Str(std::string(buf, n));
    }
    return ErrorAt(pos, "unsupported function '" + name + "'");
  }

  StatusOr<Value> CallMacro(const Node& m, const Args& args, Pos pos) {
    if (args.pos.size() > m.names.size()) {
      return ErrorAt(pos, "macro '" + m.text + "' takes " +
                              std::to_string(m.names.size()) +
                              " arguments, got " +
                              std::to_string(args.pos.size()));
    }
    Frame frame;
    frame.parent = globals_;
    for (const auto& [k, v] : args.kw) {
      if (std::find(m.names.begin(), m.names.end(), k) == m.names.end()) {
        return ErrorAt(pos, "macro '" + m.text +
                                "' got an unexpected keyword argument '" + k +
                                "'");
      }
    }
    for (size_t k = 0; k < m.names.size(); ++k) {
      Value v = args.Get(k, m.names[k], Value::Undef(m.names[k]));
      if (v.undefined() && k >= args.pos.size() && m.exprs[k]) {
        bool given = false;
        for (const auto& kv : args.kw) given |= kv.first == m.names[k];
        if (!given) {
          ASSIGN_OR_RETURN(v, Eval(*m.exprs[k], &frame));
        }
      }
      frame.vars[m.names[k]] = std::move(v);
    }
    std::string out;
    Flow flow = Flow::kNormal;
    RETURN_IF_ERROR(Exec(m.bodies[0], &frame, &out, &flow));
    return Value::Str(std::move(out));
  }

  StatusOr<Value> CallMethod(const Value& obj, const std::string& name,
                             const Args& args, Pos pos) {
    if (obj.undefined()) {
      return ErrorAt(pos, "'" + (obj.s.empty() ? std::string("value") : obj.s) +
                              "' is undefined (calling method '" + name + "')");
    }
    if (obj.is_str()) {
      const std::string& s = obj.s;
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const Value chars = args.Get(0, "chars");
        const std::string* set = chars.is_str() ? &chars.s : nullptr;
        return Value::Str(PyStrip(s, name != "rstrip", name != "lstrip", set));
      }
      if (name == "upper") return Value::Str(AsciiUpper(s));
      if (name == "lower") return Value::Str(AsciiLower(s));
      if (name == "title") return Value::Str(PyTitle(s));
      if (name == "capitalize") return Value::Str(PyCapitalize(s));
      if (name == "startswith" || name == "endswith") {
        const Value p = args.Get(0, "prefix");
        std::vector<std::string> cands;
        if (p.is_str()) {
          cands.push_back(p.s);
        } else if (p.is_list()) {
          for (const Value& x : *p.list) {
            if (x.is_str()) cands.push_back(x.s);
          }
        } else {
          return ErrorAt(pos, name + "() argument must be a string or tuple");
        }
        for (const std::string& c : cands) {
          if (c.size() > s.size()) continue;
          if (name == "startswith"
                  ? s.compare(0, c.size(), c) == 0
                  : s.compare(s.size() - c.size(), c.size(), c) == 0) {
            return Value::Bool(true);
          }
        }
        return Value::Bool(false);
      }
      if (name == "split" || name == "rsplit") {
        const Value sep = args.Get(0, "sep", Value::None());
        const Value maxv = args.Get(1, "maxsplit", Value::Int(-1));
        const int64_t maxsplit = maxv.is_number() ? maxv.AsInt() : -1;
        std::vector<Value> parts;
        if (name == "rsplit" && maxsplit >= 0) {
          return ErrorAt(pos, "unsupported: rsplit with maxsplit");
        }
        if (sep.is_str()) {
          if (sep.s.empty()) return ErrorAt(pos, "split(): empty separator");
          size_t p = 0;
          int64_t n = 0;
          while (maxsplit < 0 || n < maxsplit) {
            const size_t hit = s.find(sep.s, p);
            if (hit == std::string::npos) break;
            parts.push_back(Value::Str(s.substr(p, hit - p)));
            p = hit + sep.s.size();
            ++n;
          }
          parts.push_back(Value::Str(s.substr(p)));
        } else {
          size_t p = 0;
          int64_t n = 0;
          while (true) {
            while (p < s.size() && IsPySpace(s[p])) ++p;
            if (p >= s.size()) break;
            if (maxsplit >= 0 && n >= maxsplit) {
              size_t e = s.size();
              while (e > p && IsPySpace(s[e - 1])) --e;
              parts.push_back(Value::Str(s.substr(p, e - p)));
              break;
            }
            size_t q = p;
            while (q < s.size() && !IsPySpace(s[q])) ++q;
            parts.push_back(Value::Str(s.substr(p, q - p)));
            ++n;
            p = q;
          }
        }
        return Value::List(std::move(parts));
      }
      if (name == "replace") {
        const Value a = args.Get(0, "old"), b = args.Get(1, "new");
        const Value c = args.Get(2, "count", Value::Int(-1));
        if (!a.is_str() || !b.is_str()) {
          return ErrorAt(pos, "replace() arguments must be strings");
        }
        return Value::Str(
            ReplaceAll(s, a.s, b.s, c.is_number() ? c.AsInt() : -1));
      }
      if (name == "find" || name == "count") {
        const Value a = args.Get(0, "sub");
        if (!a.is_str()) return ErrorAt(pos, name + "() needs a string");
        if (name == "find") {
          const size_t hit = s.find(a.s);
          if (hit == std::string::npos) return Value::Int(-1);
          return Value::Int(
              static_cast<int64_t>(CodePoints(s.substr(0, hit)).size()) - 1);
        }
        int64_t n = 0;
        if (a.s.empty()) {
          return Value::Int(static_cast<int64_t>(CodePoints(s).size()));
        }
        for (size_t p = s.find(a.s); p != std::string::npos;
             p = s.find(a.s, p + a.s.size())) {
          ++n;
        }
        return Value::Int(n);
      }
      if (name == "join") {
        const Value items = args.Get(0, "iterable");
        ASSIGN_OR_RETURN(std::vector<Value> xs, Iterate(items, pos));
        std::string out;
        for (size_t k = 0; k < xs.size(); ++k) {
          if (k) out += s;
          out += ToStr(xs[k]);
        }
        return Value::Str(std::move(out));
      }
      return ErrorAt(pos, "unsupported string method '" + name + "'");
    }
    if (obj.is_dict()) {
      if (name == "items" || name == "keys" || name == "values") {
        std::vector<Value> out;
        for (const auto& [k, v] : obj.dict->items) {
          if (name == "items") {
            out.push_back(Value::Tuple({Value::Str(k), v}));
          } else {
            out.push_back(name == "keys" ? Value::Str(k) : v);
          }
        }
        return Value::List(std::move(out));
      }
      if (name == "get") {
        const Value key = args.Get(0, "key");
        const Value def = args.Get(1, "default", Value::None());
        if (key.is_str()) {
          const Value* v = obj.dict->Find(key.s);
          if (v != nullptr) return *v;
        }
        return def;
      }
      return ErrorAt(pos, "unsupported dict method '" + name + "'");
    }
    return ErrorAt(
        pos, "unsupported method '" + name + "' on '" + TypeName(obj) + "'");
  }

  StatusOr<Value> Binary(const std::string& op, const Value& a, const Value& b,
                         Pos pos) {
    if (op == "~") return Value::Str(ToStr(a) + ToStr(b));
    if (op == "==") return Value::Bool(Equal(a, b));
    if (op == "!=") return Value::Bool(!Equal(a, b));
    if (op == "in" || op == "not in") {
      ASSIGN_OR_RETURN(bool in, Contains(b, a, pos));
      return Value::Bool(in == (op == "in"));
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      if (a.undefined()) return Undefined(pos, a);
      if (b.undefined()) return Undefined(pos, b);
      const std::optional<int> c = Compare(a, b);
      if (!c) {
        return ErrorAt(pos, "'" + op + "' not supported between '" +
                                TypeName(a) + "' and '" + TypeName(b) + "'");
      }
      return Value::Bool(op == "<"    ? *c < 0
                         : op == ">"  ? *c > 0
                         : op == "<=" ? *c <= 0
                                      : *c >= 0);
    }
    if (a.undefined()) return Undefined(pos, a);
    if (b.undefined()) return Undefined(pos, b);
    const auto type_error = [&]() {
      return ErrorAt(pos, "unsupported operand types for " + op + ": '" +
                              TypeName(a) + "' and '" + TypeName(b) + "'");
    };
    if (op == "+") {
      if (a.is_str() && b.is_str()) return Value::Str(a.s + b.s);
      if (a.is_list() && b.is_list()) {
        std::vector<Value> items = *a.list;
        items.insert(items.end(), b.list->begin(), b.list->end());
        return Value::List(std::move(items));
      }
    }
    if (op == "*" && (a.is_str() || a.is_list() || b.is_str() || b.is_list())) {
      const Value& seq = a.is_str() || a.is_list() ? a : b;
      const Value& n = a.is_str() || a.is_list() ? b : a;
      if (n.t != Value::T::kInt && n.t != Value::T::kBool) return type_error();
      const int64_t times = std::max<int64_t>(0, n.AsInt());
      const size_t unit = seq.is_str() ? seq.s.size() : seq.list->size();
      if (unit != 0 && static_cast<uint64_t>(times) >
                           kMaxOutputBytes / std::max<size_t>(unit, 1)) {
        return ErrorAt(pos, "repetition too large");
      }
      if (seq.is_str()) {
        std::string out;
        for (int64_t k = 0; k < times; ++k) out += seq.s;
        return Value::Str(std::move(out));
      }
      std::vector<Value> items;
      for (int64_t k = 0; k < times; ++k) {
        items.insert(items.end(), seq.list->begin(), seq.list->end());
      }
      return Value::List(std::move(items));
    }
    if (!a.is_number() || !b.is_number()) return type_error();
    const bool floats = a.t == Value::T::kFloat || b.t == Value::T::kFloat;
    if (op == "/") {
      if (b.AsDouble() == 0) return ErrorAt(pos, "division by zero");
      return Value::Float(a.AsDouble() / b.AsDouble());
    }
    if (floats) {
      const double x = a.AsDouble(), y = b.AsDouble();
      if (op == "+") return Value::Float(x + y);
      if (op == "-") return Value::Float(x - y);
      if (op == "*") return Value::Float(x * y);
      if (op == "**") return Value::Float(std::pow(x, y));
      if (y == 0) return ErrorAt(pos, "division by zero");
      if (op == "//") return Value::Float(std::floor(x / y));
      if (op == "%") {
        double m = std::fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return Value::Float(m);
      }
      return type_error();
    }
    const int64_t x = a.AsInt(), y = b.AsInt();
    int64_t r = 0;
    if (op == "+" || op == "-" || op == "*") {
      const bool overflow = op == "+"   ? __builtin_add_overflow(x, y, &r)
                            : op == "-" ? __builtin_sub_overflow(x, y, &r)
                                        : __builtin_mul_overflow(x, y, &r);
      if (overflow) return ErrorAt(pos, "integer overflow");
      return Value::Int(r);
    }
    if (op == "**") {
      if (y < 0) return Value::Float(std::pow(x, y));
      r = 1;
      for (int64_t k = 0; k < y; ++k) {
        if (__builtin_mul_overflow(r, x, &r)) {
          return ErrorAt(pos, "integer overflow");
        }
        if (r == 0 || r == 1) break;
      }
      return Value::Int(r);
    }
    if (y == 0) return ErrorAt(pos, "division by zero");
    if (x == INT64_MIN && y == -1) return ErrorAt(pos, "integer overflow");
    int64_t q = x / y, m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) {
      --q;
      m += y;
    }
    if (op == "//") return Value::Int(q);
    if (op == "%") {
      return Value::Int(m);
    }
    return type_error();
  }

  StatusOr<bool> Contains(const Value& container, const Value& item, Pos pos) {
    switch (container.t) {
      case Value::T::kString:
        if (!item.is_str()) {
          return ErrorAt(pos, std::string("'in <string>' requires string as "
                                          "left operand, not '") +
                                  TypeName(item) + "'");
        }
        return container.s.find(item.s) != std::string::npos;
      case Value::T::kList:
        for (const Value& v : *container.list) {
          if (Equal(v, item)) return true;
        }
        return false;
      case Value::T::kDict:
        return item.is_str() && container.dict->Find(item.s) != nullptr;
      case Value::T::kUndefined:
        return Undefined(pos, container);
      default:
        return ErrorAt(pos, std::string("argument of type '") +
                                TypeName(container) + "' is not iterable");
    }
  }

  StatusOr<bool> ApplyTest(const std::string& name, const Value& v,
                           const Args& args, Pos pos) {
    using T = Value::T;
    if (name == "defined") return !v.undefined();
    if (name == "undefined") return v.undefined();
    if (name == "none") return v.t == T::kNone;
    if (name == "string") return v.is_str();
    if (name == "mapping") return v.is_dict();
    if (name == "sequence") return v.is_str() || v.is_list() || v.is_dict();
    if (name == "iterable") {
      return v.is_str() || v.is_list() || v.is_dict() || v.undefined();
    }
    if (name == "number") return v.is_number();
    if (name == "integer") return v.t == T::kInt;
    if (name == "float") return v.t == T::kFloat;
    if (name == "boolean") return v.t == T::kBool;
    if (name == "true") return v.t == T::kBool && v.b;
    if (name == "false") return v.t == T::kBool && !v.b;
    if (name == "callable") return v.t == T::kMacro || v.t == T::kBuiltin;
    if (name == "lower") return v.is_str() && AsciiLower(v.s) == v.s;
    if (name == "upper") return v.is_str() && AsciiUpper(v.s) == v.s;
    if (name == "odd" || name == "even" || name == "divisibleby") {
      if (v.t != T::kInt && v.t != T::kBool) {
        return ErrorAt(pos, "test '" + name + "' needs an integer");
      }
      int64_t d = 2;
      if (name == "divisibleby") {
        const Value a = args.Get(0, "num");
        if (a.t != T::kInt || a.i == 0) {
          return ErrorAt(pos, "divisibleby needs a non-zero integer");
        }
        d = a.i;
      }
      const bool div = v.AsInt() % d == 0;
      return name == "odd" ? !div : div;
    }
    const Value other = args.Get(0, "b");
    if (name == "eq" || name == "equalto" || name == "==") {
      return Equal(v, other);
    }
    if (name == "ne" || name == "!=") return !Equal(v, other);
    if (name == "sameas") {
      if (v.t == T::kList || v.t == T::kDict) {
        return v.t == other.t && v.list == other.list && v.dict == other.dict;
      }
      return v.t == other.t && Equal(v, other);
    }
    if (name == "in") return Contains(other, v, pos);
    if (name == "lt" || name == "lessthan" || name == "le" || name == "gt" ||
        name == "greaterthan" || name == "ge") {
      const std::optional<int> c = Compare(v, other);
      if (!c) return ErrorAt(pos, "test '" + name + "': values not comparable");
      if (name == "lt" || name == "lessthan") return *c < 0;
      if (name == "le") return *c <= 0;
      if (name == "gt" || name == "greaterthan") return *c > 0;
      return *c >= 0;
    }
    return ErrorAt(pos, "unsupported test '" + name + "'");
  }

  StatusOr<Value> ApplyFilter(const std::string& name, const Value& v,
                              const Args& args, Pos pos) {
    using T = Value::T;
    if (name == "safe") return v;
    if (name == "default" || name == "d") {
      const bool boolean = Truthy(args.Get(1, "boolean", Value::Bool(false)));
      if (v.undefined() || (boolean && !Truthy(v))) {
        return args.Get(0, "default_value", Value::Str(""));
      }
      return v;
    }
    if (name == "tojson") {
      const Value ind = args.Get(0, "indent", Value::None());
      const int indent =
          ind.t == T::kInt ? static_cast<int>(std::clamp<int64_t>(ind.i, 0, 64))
                           : -1;
      const bool sort_keys = Truthy(args.Get(99, "sort_keys"));
      std::string out;
      if (!PyJson(v, indent, sort_keys, 0, &out)) {
        return ErrorAt(pos, std::string("tojson: object of type '") +
                                TypeName(v) + "' is not JSON serializable");
      }
      return Value::Str(std::move(out));
    }
    if (name == "string") return Value::Str(ToStr(v));
    if (name == "length" || name == "count") {
      switch (v.t) {
        case T::kUndefined:
          return Value::Int(0);
        case T::kString:
          return Value::Int(static_cast<int64_t>(CodePoints(v.s).size()) - 1);
        case T::kList:
          return Value::Int(static_cast<int64_t>(v.list->size()));
        case T::kDict:
          return Value::Int(static_cast<int64_t>(v.dict->items.size()));
        default:
          return ErrorAt(pos, std::string("object of type '") + TypeName(v) +
                                  "' has no len()");
      }
    }
    if (name == "list") {
      ASSIGN_OR_RETURN(std::vector<Value> xs, Iterate(v, pos));
      return Value::List(std::move(xs));
    }
    if (name == "items") {
      if (v.undefined()) return Value::List();
      if (!v.is_dict()) return ErrorAt(pos, "items filter needs a mapping");
      return CallMethod(v, "items", Args{}, pos);
    }
    if (name == "int") {
      if (v.t == T::kInt || v.t == T::kBool) return Value::Int(v.AsInt());
      if (v.t == T::kFloat) {
        if (!std::isfinite(v.f)) return args.Get(0, "default", Value::Int(0));
        return Value::Int(static_cast<int64_t>(v.f));
      }
      if (v.is_str()) {
        const std::string s = PyStrip(v.s, true, true, nullptr);
        int64_t x = 0;
        auto r = std::from_chars(s.data(), s.data() + s.size(), x);
        if (r.ec == std::errc() && r.ptr == s.data() + s.size() && !s.empty()) {
          return Value::Int(x);
        }
        char* end = nullptr;
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(d) &&
            std::fabs(d) < 9.2e18) {
          return Value::Int(static_cast<int64_t>(d));
        }
      }
      return args.Get(0, "default", Value::Int(0));
    }
    if (name == "float") {
      if (v.is_number()) return Value::Float(v.AsDouble());
      if (v.is_str()) {
        const std::string s = PyStrip(v.s, true, true, nullptr);
        char* end = nullptr;
        const double x = std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size()) return Value::Float(x);
      }
      return args.Get(0, "default", Value::Float(0));
    }
    if (name == "abs") {
      if (v.t == T::kFloat) return Value::Float(std::fabs(v.f));
      if (v.t == T::kInt || v.t == T::kBool) {
        if (v.AsInt() == INT64_MIN) return ErrorAt(pos, "integer overflow");
        return Value::Int(v.AsInt() < 0 ? -v.AsInt() : v.AsInt());
      }
      return ErrorAt(pos, "abs needs a number");
    }
    if (name == "round") {
      if (!v.is_number()) return ErrorAt(pos, "round needs a number");
      const Value prec = args.Get(0, "precision", Value::Int(0));
      const std::string method =
          ToStr(args.Get(1, "method", Value::Str("common")));
      const int64_t digits = prec.is_number() ? prec.AsInt() : 0;
      if (method == "common" && v.t != T::kFloat) return v;  // int stays int
      if (method == "common" && digits >= 0 && digits <= 30) {
        // Python's round(): correctly rounded, ties to even, on the exact
        // binary value -- which is what printf does.
        char buf[400];
        std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(digits), v.f);
        return Value::Float(std::strtod(buf, nullptr));
      }
      const double scale = std::pow(10.0, static_cast<double>(digits));
      const double x = v.AsDouble() * scale;
      double r;
      if (method == "common") {
        r = std::nearbyint(x);
      } else if (method == "floor") {
        r = std::floor(x);
      } else if (method == "ceil") {
        r = std::ceil(x);
      } else {
        return ErrorAt(pos, "round: method must be common, floor or ceil");
      }
      return Value::Float(r / scale);
    }
    if (name == "first" || name == "last") {
      ASSIGN_OR_RETURN(std::vector<Value> xs, Iterate(v, pos));
      if (xs.empty()) return Value::Undef("");
      return name == "first" ? xs.front() : xs.back();
    }
    if (name == "reverse") {
      ASSIGN_OR_RETURN(std::vector<Value> xs, Iterate(v, pos));
      std::reverse(xs.begin(), xs.end());
      if (v.is_str()) {
        std::string s;
        for (const Value& x : xs) s += x.s;
        return Value::Str(std::move(s));
      }
      return Value::List(std::move(xs));
    }
    if (name == "join") {
      ASSIGN_OR_RETURN(std::vector<Value> xs, Iterate(v, pos));
      const std::string sep = ToStr(args.Get(0, "d", Value::Str("")));
      const Value attr = args.Get(1, "attribute", Value::None());
      std::string out;
      for (size_t k = 0; k < xs.size(); ++k) {
        if (k) out += sep;
        if (attr.is_str()) {
          ASSIGN_OR_RETURN(Value x, GetAttrPath(xs[k], attr.s, pos));
          out += ToStr(x);
        } else {
          out += ToStr(xs[k]);
        }
      }
      return Value::Str(std::move(out));
    }
    if (name == "upper" || name == "lower" || name == "capitalize" ||
        name == "title" || name == "trim") {
      if (v.undefined()) return Undefined(pos, v);
      const std::string s = ToStr(v);
      if (name == "upper") return Value::Str(AsciiUpper(s));
      if (name == "lower") return Value::Str(AsciiLower(s));
      if (name == "capitalize") return Value::Str(PyCapitalize(s));
      if (name == "trim") {
        const Value chars = args.Get(0, "chars", Value::None());
        return Value::Str(
            PyStrip(s, true, true, chars.is_str() ? &chars.s : nullptr));
      }
      // jinja2's title: words start after whitespace, '-', '(', '{', '[',
      // '<'.
      std::string out = s;
      bool start = true;
      for (char& c : out) {
        const bool sep = IsPySpace(c) || c == '-' || c == '(' || c == '{' ||
                         c == '[' || c == '<';
        if (sep) {
          start = true;
          continue;
        }
        std::string one(1, c);
        c = start ? AsciiUpper(one)[0] : AsciiLower(one)[0];
        start = false;
      }
      return Value::Str(std::move(out));
    }
    if (name == "replace") {
      const std::string s = ToStr(v);
      const Value a = args.Get(0, "old"), b = args.Get(1, "new");
      const Value c = args.Get(2, "count", Value::None());
      return Value::Str(
          ReplaceAll(s, ToStr(a), ToStr(b), c.is_number() ? c.AsInt() : -1));
    }
    if (name == "escape" || name == "e") {
      const std::string s = ToStr(v);
      std::string out;
      for (const char c : s) {
        switch (c) {
          case '&':
            out += "&amp;";
            break;
          case '<':
            out += "&lt;";
            break;
          case '>':
            out += "&gt;";
            break;
          case '"':
            out += "&#34;";
            break;
          case '\'':
            out += "&#39;";
            break;
          default:
            out += c;
        }
      }
      return Value::Str(std::move(out));
    }
    if (name == "unique") {
      ASSIGN_OR_RETURN(std::vector<Value> xs, Iterate(v, pos));
      const bool cs = Truthy(args.Get(0, "case_sensitive", Value::Bool(false)));
      std::vector<Value> out, keys;
      for (const Value& x : xs) {
        const Value key = !cs && x.is_str() ? Value::Str(AsciiLower(x.s)) : x;
        bool seen = false;
        for (const Value& k : keys) seen |= Equal(k, key);
        if (!seen) {
          keys.push_back(key);
          out.push_back(x);
        }
      }
      return Value::List(std::move(out));
    }
    if (name == "map") {
      ASSIGN_OR_RETURN(std::vector<Value> xs, Iterate(v, pos));
      std::vector<Value> out;
      const Value attr = args.Get(99, "attribute", Value::None());
      if (attr.is_str()) {
        const Value def = args.Get(99, "default");
        for (const Value& x : xs) {
          ASSIGN_OR_RETURN(Value y, GetAttrPath(x, attr.s, pos));
          out.push_back(y.undefined() && !def.undefined() ? def : y);
        }
        return Value::List(std::move(out));
      }
      if (args.pos.empty() || !args.pos[0].is_str()) {
        return ErrorAt(pos, "map needs a filter name or attribute=");
      }
      Args rest;
      rest.pos.assign(args.pos.begin() + 1, args.pos.end());
      rest.kw = args.kw;
      for (const Value& x : xs) {
        ASSIGN_OR_RETURN(Value y, ApplyFilter(args.pos[0].s, x, rest, pos));
        out.push_back(std::move(y));
      }
      return Value::List(std::move(out));
    }
    if (name == "select" || name == "reject" || name == "selectattr" ||
        name == "rejectattr") {
      ASSIGN_OR_RETURN(std::vector<Value> xs, Iterate(v, pos));
      const bool by_attr = name == "selectattr" || name == "rejectattr";
      const bool keep_if = name == "select" || name == "selectattr";
      size_t k = 0;
      std::string attr;
      if (by_attr) {
        if (args.pos.empty() || !args.pos[0].is_str()) {
          return ErrorAt(pos, name + " needs an attribute name");
        }
        attr = args.pos[0].s;
        k = 1;
      }
      std::string test;
      if (k < args.pos.size()) {
        if (!args.pos[k].is_str())
          return ErrorAt(pos, name + ": bad test name");
        test = args.pos[k].s;
      }
      Args targs;
      if (k + 1 < args.pos.size()) {
        targs.pos.assign(args.pos.begin() + k + 1, args.pos.end());
      }
      std::vector<Value> out;
      for (const Value& x : xs) {
        Value subject = x;
        if (by_attr) {
          ASSIGN_OR_RETURN(subject, GetAttrPath(x, attr, pos));
        }
        bool r;
        if (test.empty()) {
          r = Truthy(subject);
        } else {
          ASSIGN_OR_RETURN(r, ApplyTest(test, subject, targs, pos));
        }
        if (r == keep_if) out.push_back(x);
      }
      return Value::List(std::move(out));
    }
    if (name == "dictsort") {
      if (!v.is_dict()) return ErrorAt(pos, "dictsort needs a mapping");
      std::vector<std::pair<std::string, Value>> items = v.dict->items;
      std::stable_sort(items.begin(), items.end(), [](auto& a, auto& b) {
        return AsciiLower(a.first) < AsciiLower(b.first);
      });
      std::vector<Value> out;
      for (auto& [k, x] : items)
        out.push_back(Value::Tuple({Value::Str(k), x}));
      return Value::List(std::move(out));
    }
    return ErrorAt(pos, "unsupported filter '" + name + "'");
  }

  // `a.b.c` attribute paths (map / selectattr / join attribute=).
  StatusOr<Value> GetAttrPath(const Value& v, const std::string& path,
                              Pos pos) {
    Value cur = v;
    size_t p = 0;
    while (true) {
      const size_t dot = path.find('.', p);
      const std::string part = path.substr(
          p, dot == std::string::npos ? std::string::npos : dot - p);
      if (cur.undefined()) return cur;
      if (cur.is_list() && !part.empty() &&
          std::all_of(part.begin(), part.end(),
                      [](char c) { return c >= '0' && c <= '9'; })) {
        ASSIGN_OR_RETURN(cur, GetItem(cur, Value::Int(std::stoll(part)), pos));
      } else {
        ASSIGN_OR_RETURN(cur, GetAttr(cur, part, pos));
      }
      if (dot == std::string::npos) return cur;
      p = dot + 1;
    }
  }

  Frame* globals_;
  std::optional<int64_t> now_;
  int depth_ = 0;
  int64_t iterations_ = 0;
};

template <typename J>
StatusOr<std::string> RenderImpl(const ChatTemplateProgram& prog,
                                 const J& context, const std::string& bos,
                                 const std::string& eos) {
  if (!context.is_object()) {
    return InvalidArgumentError("chat template context must be an object");
  }
  Frame builtins;
  for (const char* fn :
       {"raise_exception", "range", "namespace", "dict", "strftime_now"}) {
    Value v;
    v.t = Value::T::kBuiltin;
    v.s = fn;
    builtins.vars[fn] = v;
  }
  Frame top;
  top.parent = &builtins;
  top.vars["bos_token"] = Value::Str(bos);
  top.vars["eos_token"] = Value::Str(eos);
  std::optional<int64_t> now;
  for (auto it = context.begin(); it != context.end(); ++it) {
    if (it.key() == ChatTemplate::kNowEpochKey) {
      if (it.value().is_number_integer())
        now = it.value().template get<int64_t>();
      continue;
    }
    bool too_deep = false;
    top.vars[it.key()] = FromJson(it.value(), 0, &too_deep);
    if (too_deep) {
      return InvalidArgumentError("chat template context: '" + it.key() +
                                  "' is nested too deeply");
    }
  }
  Renderer r(&top, now);
  std::string out;
  Flow flow = Flow::kNormal;
  RETURN_IF_ERROR(r.Exec(prog.body, &top, &out, &flow));
  return out;
}

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  // jinja2 normalizes newlines to "\n" and drops one trailing newline
  // (keep_trailing_newline=False).
  std::string src;
  src.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      src += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      src += source[k];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  Lexer lexer(src);
  ASSIGN_OR_RETURN(std::vector<Chunk> chunks, lexer.Run());
  Parser parser(std::move(chunks));
  ASSIGN_OR_RETURN(Body body, parser.ParseAll());
  auto prog = std::make_shared<ChatTemplateProgram>();
  prog->source = std::string(source);
  prog->body = std::move(body);
  ChatTemplate t;
  t.program_ = std::move(prog);
  return t;
}

StatusOr<std::string> ChatTemplate::Render(
    const nlohmann::ordered_json& context) const {
  return RenderImpl(*program_, context, bos_token_, eos_token_);
}

StatusOr<std::string> ChatTemplate::Render(
    const nlohmann::json& context) const {
  return RenderImpl(*program_, context, bos_token_, eos_token_);
}

const std::string& ChatTemplate::source() const { return program_->source; }

namespace {

std::string TokenString(const Json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return "";
}

}  // namespace

StatusOr<ChatTemplate> LoadChatTemplate(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  const fs::path config_path = dir / "tokenizer_config.json";
  std::error_code ec;
  Json config = Json::object();
  if (fs::exists(config_path, ec)) {
    ASSIGN_OR_RETURN(
        config, ReadJsonFile(config_path.string(), "tokenizer_config.json"));
    if (!config.is_object()) {
      return DataLossError("tokenizer_config.json: not a JSON object");
    }
  }
  std::string source;
  const fs::path jinja_path = dir / "chat_template.jinja";
  if (fs::exists(jinja_path, ec)) {
    ASSIGN_OR_RETURN(source, ReadFileToString(jinja_path.string()));
  } else {
    const auto it = config.find("chat_template");
    if (it == config.end() || it->is_null()) {
      return NotFoundError(model_dir +
                           ": no chat template (no chat_template.jinja and no "
                           "chat_template in tokenizer_config.json)");
    }
    if (it->is_string()) {
      source = it->get<std::string>();
    } else if (it->is_array()) {
      bool found = false;
      for (const auto& entry : *it) {
        if (!entry.is_object()) continue;
        const auto name = entry.find("name");
        const auto tmpl = entry.find("template");
        if (name != entry.end() && name->is_string() &&
            name->get<std::string>() == "default" && tmpl != entry.end() &&
            tmpl->is_string()) {
          source = tmpl->get<std::string>();
          found = true;
        }
      }
      if (!found) {
        return NotFoundError(
            "tokenizer_config.json: chat_template list has no \"default\" "
            "entry");
      }
    } else {
      return DataLossError(
          "tokenizer_config.json: chat_template must be a string or a list");
    }
  }
  ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::Parse(source));
  t.set_special_tokens(TokenString(config, "bos_token"),
                       TokenString(config, "eos_token"));
  return t;
}

}  // namespace loom::tok
