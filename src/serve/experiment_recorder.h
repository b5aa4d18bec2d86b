// persistence.auto_persist: the generation routes of `loom serve` record
// each completed request as an experiment (docs/server.md, "Recording
// generations"). The HTTP worker builds an ExperimentRecord from what it
// answered and hands it to an ExperimentRecorder; one background thread
// writes the records to the ExperimentStore in the order they came, so a
// reply never waits for SQLite or for a hidden-state file.
//
// The queue is bounded (records and hidden-state bytes): a record that does
// not fit is dropped at once, counted and logged, rather than making the
// request wait or the server's memory grow. A store error is logged and
// counted, never reported to the client; an experiment whose writes failed
// part way is deleted (best effort), so the store holds whole records only.
//
// Thread-safety: Submit and Counts may be called from any thread. The
// destructor writes what is still queued, then stops the thread.
#ifndef LOOM_SERVE_EXPERIMENT_RECORDER_H_
#define LOOM_SERVE_EXPERIMENT_RECORDER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"
#include "src/core/tensor.h"
#include "src/serve/experiments.h"

namespace loom::serve {

// One experiment as the store will hold it.
struct ExperimentRecord {
  struct Message {
    std::string role;
    std::string content;
  };
  struct Metric {
    std::string name;
    double value = 0;
    std::string unit;
  };
  // One saved array: `values` holds shape.numel() floats, stored in `dtype`
  // (F32, BF16 or F16; rounded when written).
  struct HiddenState {
    int64_t layer = 0;
    DType dtype = DType::kF32;
    Shape shape;
    std::vector<float> values;
  };

  std::string model;
  nlohmann::json config = nlohmann::json::object();
  std::string status = "completed";  // completed | failed
  std::string notes;
  std::vector<Message> conversations;
  std::vector<Metric> metrics;
  std::vector<HiddenState> hidden_states;

  // The bytes the record's arrays hold in the queue.
  int64_t ArrayBytes() const;
};

// Writes `record` to `store` (the experiment, then its messages, metrics and
// arrays, in that order); returns the new id. On an error after the
// experiment was created it is deleted again (best effort).
StatusOr<std::string> WriteExperiment(ExperimentStore& store,
                                      const ExperimentRecord& record);

class ExperimentRecorder {
 public:
  struct Limits {
    // Records waiting to be written, and the bytes of their arrays.
    size_t max_records = 256;
    int64_t max_bytes = int64_t{256} << 20;
  };
  struct Counts {
    int64_t persisted = 0;  // experiments written
    int64_t errors = 0;     // records the store refused (logged)
    int64_t dropped = 0;    // records refused because the queue was full
    int64_t queued = 0;     // records waiting now
  };

  // `store` must outlive the recorder.
  explicit ExperimentRecorder(ExperimentStore* store);
  ExperimentRecorder(ExperimentStore* store, Limits limits);
  ~ExperimentRecorder();
  ExperimentRecorder(const ExperimentRecorder&) = delete;
  ExperimentRecorder& operator=(const ExperimentRecorder&) = delete;

  // Queues a record; never blocks on the store. False (and counted in
  // `dropped`) when the queue is full.
  bool Submit(ExperimentRecord record);
  // Blocks until every record submitted before the call is written (or has
  // failed).
  void Flush();
  Counts counts() const;

 private:
  void Loop();
  void Log(const std::string& what, int64_t count);

  ExperimentStore* store_;
  Limits limits_;
  mutable std::mutex mu_;
  std::condition_variable wake_;  // a record came, or stopping
  std::condition_variable idle_;  // a record was written
  std::deque<ExperimentRecord> queue_;
  int64_t queued_bytes_ = 0;
  int64_t submitted_ = 0, finished_ = 0;
  Counts counts_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace loom::serve

#endif  // LOOM_SERVE_EXPERIMENT_RECORDER_H_
