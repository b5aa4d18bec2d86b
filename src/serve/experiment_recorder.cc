#include "src/serve/experiment_recorder.h"

#include <cstdio>
#include <utility>

#include "src/base/float16.h"

namespace loom::serve {

int64_t ExperimentRecord::ArrayBytes() const {
  int64_t bytes = 0;
  for (const HiddenState& h : hidden_states)
    bytes += static_cast<int64_t>(h.values.size() * sizeof(float));
  return bytes;
}

namespace {

Status SaveArray(ExperimentStore& store, const std::string& id,
                 const ExperimentRecord::HiddenState& h) {
  if (h.shape.numel() != static_cast<int64_t>(h.values.size()))
    return InternalError("hidden state of layer " + std::to_string(h.layer) +
                         ": shape does not match its values");
  if (h.dtype == DType::kF32)
    return store.SaveHiddenState(id, h.layer, h.dtype, h.shape, h.values.data())
        .status();
  std::vector<uint16_t> half(h.values.size());
  for (size_t i = 0; i < half.size(); ++i)
    half[i] = h.dtype == DType::kBF16 ? F32ToBf16(h.values[i])
                                      : F32ToF16(h.values[i]);
  return store.SaveHiddenState(id, h.layer, h.dtype, h.shape, half.data())
      .status();
}

}  // namespace

StatusOr<std::string> WriteExperiment(ExperimentStore& store,
                                      const ExperimentRecord& r) {
  ASSIGN_OR_RETURN(std::string id, store.CreateExperiment(r.model, r.config,
                                                          r.status, r.notes));
  Status s;
  for (const auto& m : r.conversations) {
    if (!s.ok()) break;
    s = store.AddConversation(id, m.role, m.content).status();
  }
  for (const auto& m : r.metrics) {
    if (!s.ok()) break;
    s = store.AddMetric(id, m.name, m.value, m.unit).status();
  }
  for (const auto& h : r.hidden_states) {
    if (!s.ok()) break;
    s = SaveArray(store, id, h);
  }
  if (!s.ok()) {
    store.DeleteExperiment(id).IgnoreError();
    return s.WithContext("experiment " + id);
  }
  return id;
}

ExperimentRecorder::ExperimentRecorder(ExperimentStore* store)
    : ExperimentRecorder(store, Limits()) {}

ExperimentRecorder::ExperimentRecorder(ExperimentStore* store, Limits limits)
    : store_(store), limits_(limits), thread_([this] { Loop(); }) {}

ExperimentRecorder::~ExperimentRecorder() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

bool ExperimentRecorder::Submit(ExperimentRecord record) {
  const int64_t bytes = record.ArrayBytes();
  int64_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // One record larger than the whole byte budget still goes into an empty
    // queue: the budget bounds what waits, not what one reply returned.
    const bool fits =
        queue_.size() < limits_.max_records &&
        (queue_.empty() || queued_bytes_ + bytes <= limits_.max_bytes);
    if (fits && !stopping_) {
      queued_bytes_ += bytes;
      queue_.push_back(std::move(record));
      ++submitted_;
    } else {
      dropped = ++counts_.dropped;
    }
  }
  if (dropped == 0) {
    wake_.notify_one();
    return true;
  }
  Log("persistence.auto_persist: the write queue is full (" +
          std::to_string(limits_.max_records) + " records or " +
          std::to_string(limits_.max_bytes) +
          " bytes of hidden states); an experiment was not recorded",
      dropped);
  return false;
}

void ExperimentRecorder::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t target = submitted_;
  idle_.wait(lock, [&] { return finished_ >= target; });
}

ExperimentRecorder::Counts ExperimentRecorder::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  Counts c = counts_;
  c.queued = static_cast<int64_t>(queue_.size());
  return c;
}

// Logs the first ten events of a kind, then every thousandth: a store that
// fails on every write must not flood the log.
void ExperimentRecorder::Log(const std::string& what, int64_t count) {
  if (count > 10 && count % 1000 != 0) return;
  std::fprintf(stderr, "loom serve: %s (%lld so far)\n", what.c_str(),
               static_cast<long long>(count));
}

void ExperimentRecorder::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, everything written
    ExperimentRecord r = std::move(queue_.front());
    queue_.pop_front();
    queued_bytes_ -= r.ArrayBytes();
    lock.unlock();
    StatusOr<std::string> id = WriteExperiment(*store_, r);
    lock.lock();
    ++finished_;
    if (id.ok()) {
      ++counts_.persisted;
    } else {
      const int64_t n = ++counts_.errors;
      lock.unlock();
      Log("persistence.auto_persist: recording an experiment of model " +
              r.model + " failed: " + id.status().ToString(),
          n);
      lock.lock();
    }
    idle_.notify_all();
  }
}

}  // namespace loom::serve
