#include "tools/cli/mpi_world.h"

#include <string>
#include <vector>

#ifdef LOOM_HAVE_MPI
#include <mpi.h>
#endif

namespace loom::cli {

#ifdef LOOM_HAVE_MPI

namespace {
Status MpiError(const char* what, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return InternalError(std::string("MPI: ") + what + ": " +
                       std::string(text, static_cast<size_t>(len)));
}
}  // namespace

bool MpiWorld::Available() { return true; }

StatusOr<MpiWorld> MpiWorld::Init() {
  MpiWorld w;
  if (int rc = MPI_Init(nullptr, nullptr); rc != MPI_SUCCESS)
    return MpiError("MPI_Init", rc);
  w.active_ = true;
  // Errors come back as codes (reported as Status), not as aborts.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &w.size_);
  return w;
}

MpiWorld::~MpiWorld() {
  if (active_) MPI_Finalize();
}

StatusOr<bool> MpiWorld::AllSucceeded(bool mine) const {
  int in = mine ? 1 : 0, out = 0;
  if (int rc = MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      rc != MPI_SUCCESS)
    return MpiError("MPI_Allreduce", rc);
  return out == 1;
}

Status MpiWorld::Share(const Status& status) const {
  // [code, message length], then the message.
  int head[2] = {static_cast<int>(status.code()),
                 static_cast<int>(status.message().size())};
  if (int rc = MPI_Bcast(head, 2, MPI_INT, 0, MPI_COMM_WORLD);
      rc != MPI_SUCCESS)
    return MpiError("MPI_Bcast", rc);
  std::vector<char> text(status.message().begin(), status.message().end());
  text.resize(static_cast<size_t>(head[1]));
  if (head[1] > 0)
    if (int rc = MPI_Bcast(text.data(), head[1], MPI_CHAR, 0, MPI_COMM_WORLD);
        rc != MPI_SUCCESS)
      return MpiError("MPI_Bcast", rc);
  if (head[0] == 0) return Status();
  return Status(static_cast<StatusCode>(head[0]),
                std::string(text.begin(), text.end()));
}

#else  // !LOOM_HAVE_MPI

bool MpiWorld::Available() { return false; }
StatusOr<MpiWorld> MpiWorld::Init() { return MpiWorld(); }
MpiWorld::~MpiWorld() = default;
StatusOr<bool> MpiWorld::AllSucceeded(bool mine) const { return mine; }
Status MpiWorld::Share(const Status& status) const { return status; }

#endif  // LOOM_HAVE_MPI

}  // namespace loom::cli
