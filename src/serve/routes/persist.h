// Recording generations as experiments (persistence.auto_persist): whether
// a request is recorded, the record of one generation, and handing it to
// the writer thread.
#ifndef LOOM_SERVE_ROUTES_PERSIST_H_
#define LOOM_SERVE_ROUTES_PERSIST_H_

#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/serve/api.h"
#include "src/serve/engine.h"
#include "src/serve/experiments.h"
#include "src/serve/routes/context.h"
#include "src/serve/routes/generation.h"

namespace loom::serve::routes {

// Whether a request is recorded: auto_persist on and the body's `persist`
// (default true; a non-boolean is a 400 either way).
StatusOr<bool> Persisting(const ServerContext& ctx, const json& b);
// A plain prompt as a conversation message.
std::vector<ExperimentRecord::Message> PromptInput(const json& p);
// The experiment of one generation (`done`: how the request ended).
ExperimentRecord Record(const Engine& e, const std::string& route,
                        const json& b, const GenFields& f, bool chat,
                        std::vector<ExperimentRecord::Message> input,
                        const StatusOr<GenResult>& g, const Status& done);
// Hands a record to the writer thread (never blocks on the store).
void Persist(ServerContext& ctx, ExperimentRecord r);

}  // namespace loom::serve::routes

#endif  // LOOM_SERVE_ROUTES_PERSIST_H_
