// `loom extract` under faults. Each case ends either in a clear error that
// leaves the committed state intact, or, after --resume, in output
// byte-identical (every file of the directory) to an uninterrupted run:
//   - SIGKILL at many random points of a job, and of the resumes themselves
//     (chains: kill, resume killed, resume killed, final resume), for .npy
//     with a ragged selector and for safetensors shards;
//   - a second process on the same --out (fresh or --resume) is refused;
//   - a full file system or a file-size limit in the middle of a job;
//   - a read-only, removed or missing output directory;
//   - a damaged rows.jsonl (cut, lines swapped, duplicated, deleted, a byte
//     changed) or manifest counts it contradicts: DATA_LOSS naming the file
//     and the byte offset, and the failed resume changes nothing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "src/eval/extract.h"
#include "src/io/npy.h"
#include "tests/golden_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing::Slurp;
using testing::Snapshot;
using testing::Spit;
// Every file of a directory: name -> bytes.
using Files = std::map<std::string, std::string>;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;
const std::string kModel = std::string(LOOM_MODELS_DIR) + "/stories260K";

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// "" when equal, else which files differ (not their bytes: they are large;
// the first 8 differences, then a count).
std::string Diff(const Files& got, const Files& want) {
  std::vector<std::string> d;
  for (const auto& [name, bytes] : want) {
    const auto it = got.find(name);
    if (it == got.end())
      d.push_back(name + " missing");
    else if (it->second != bytes)
      d.push_back(name + " differs (" + std::to_string(it->second.size()) +
                  " vs " + std::to_string(bytes.size()) + " bytes)");
  }
  for (const auto& [name, bytes] : got)
    if (!want.count(name)) d.push_back(name + " is extra");
  std::string text;
  for (size_t i = 0; i < d.size() && i < 8; ++i) text += d[i] + "; ";
  if (d.size() > 8) text += "and " + std::to_string(d.size() - 8) + " more";
  return text;
}

// ---- Child processes --------------------------------------------------------

struct SpawnOptions {
  std::string log;  // stdout and stderr go here ("" = /dev/null)
  // RLIMIT_FSIZE of the child, with SIGXFSZ ignored: a write past it fails
  // with EFBIG.
  rlim_t file_size_limit = RLIM_INFINITY;
  // Drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the child's bounding
  // set before exec, so that root obeys file permissions.
  bool obey_permissions = false;
};

// The child's exit code when it could not drop the capabilities.
constexpr int kCannotDropCaps = 125;

pid_t Spawn(const std::vector<std::string>& args, const SpawnOptions& o) {
  std::vector<char*> argv;
  for (const std::string& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const std::string log = o.log.empty() ? "/dev/null" : o.log;
  const pid_t pid = ::fork();
  if (pid < 0) {
    // Never return -1: kill(-1, ...) would signal every process.
    std::perror("fork");
    std::abort();
  }
  if (pid != 0) return pid;
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) ::_exit(127);
  ::dup2(fd, 1);
  ::dup2(fd, 2);
  if (o.file_size_limit != RLIM_INFINITY) {
    ::signal(SIGXFSZ, SIG_IGN);  // kept across exec
    const rlimit r{o.file_size_limit, o.file_size_limit};
    if (::setrlimit(RLIMIT_FSIZE, &r) != 0) ::_exit(127);
  }
  if (o.obey_permissions &&
      (::prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, 0, 0, 0) != 0 ||
       ::prctl(PR_CAPBSET_DROP, CAP_DAC_READ_SEARCH, 0, 0, 0) != 0))
    ::_exit(kCannotDropCaps);
  ::execv(argv[0], argv.data());
  ::_exit(127);
}

struct ExitStatus {
  bool signaled = false;
  int code = -1;  // exit code when not signaled
  std::string ToString() const {
    return signaled ? "killed by a signal" : "exit " + std::to_string(code);
  }
};

ExitStatus Decode(int status) {
  ExitStatus e;
  e.signaled = WIFSIGNALED(status);
  if (WIFEXITED(status)) e.code = WEXITSTATUS(status);
  return e;
}

ExitStatus Wait(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return Decode(status);
}

ExitStatus RunLoom(const std::vector<std::string>& args,
                   const SpawnOptions& o = {}) {
  return Wait(Spawn(args, o));
}

// Waits until `path` exists; nullopt then, or the child's exit status if it
// ended first (reaped).
std::optional<ExitStatus> WaitForFileOrExit(const std::string& path,
                                            pid_t pid) {
  const Clock::time_point limit = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < limit) {
    if (fs::exists(path)) return std::nullopt;
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return Decode(status);
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  ::kill(pid, SIGKILL);
  return Wait(pid);
}

// The CPU time a process has used so far, in seconds: the sum over its
// threads of the first field of /proc/<pid>/task/*/schedstat (nanoseconds
// on the CPU); -1 when unreadable. Kill points are placed on this clock, not
// on wall time, so that other load on the machine (which stretches a run's
// wall time unevenly) does not move them past the end of the job.
double CpuSeconds(pid_t pid) {
  std::error_code ec;
  double total = 0;
  bool any = false;
  for (const auto& t :
       fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream in(t.path() / "schedstat");
    long long ns = 0;
    if (in >> ns) {
      total += static_cast<double>(ns) * 1e-9;
      any = true;
    }
  }
  return any ? total : -1.0;
}

// The CPU time (user + system) of a reaped child, in seconds.
double CpuOf(const rusage& u) {
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// ---- Jobs -------------------------------------------------------------------

// Plain-text prompts of varied lengths.
std::string Prompts(int rows) {
  std::string text;
  for (int i = 0; i < rows; ++i)
    text += "Row " + std::to_string(i) +
            ": the little dog ran to the park and saw " +
            std::string(static_cast<size_t>(i % 13), 'a') + " big ball.\n";
  return text;
}

// A `loom extract` job: its flags without --out and --resume.
struct Job {
  std::vector<std::string> flags;
  std::vector<std::string> Args(const std::string& out,
                                bool resume = false) const {
    std::vector<std::string> a = {LOOM_BINARY, "extract"};
    a.insert(a.end(), flags.begin(), flags.end());
    a.insert(a.end(), {"--out", out});
    if (resume) a.push_back("--resume");
    return a;
  }
};

// Two hooks, a fixed, a reduced and a ragged selector, or safetensors shards
// of a fixed and a ragged one; one thread, small windows (many commits).
Job MakeJob(const std::string& input, bool safetensors) {
  Job j;
  j.flags = {
      "--model",        kModel,
      "--input",        input,
      "--hooks",        "blocks.1.hook_resid_post,blocks.-1.hook_mlp_out",
      "--select",       "last",
      "--select",       "all",
      "--commit-every", "7",
      "--batch-tokens", "64",
      "--threads",      "1",
      "--quiet"};
  if (safetensors) {
    j.flags.insert(j.flags.end(), {"--format", "safetensors"});
  } else {
    j.flags.insert(j.flags.end(), {"--select", "mean"});
  }
  return j;
}

std::optional<Json> ReadManifest(const std::string& out) {
  const std::string text = Slurp(out + "/manifest.json");
  Json m = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.is_object()) return std::nullopt;
  return m;
}

// A kill left files longer than their commit: it landed inside a commit
// (after the first array's rows were appended, before the manifest was
// replaced), or while a shard or the manifest was being written.
bool KilledInsideCommit(const std::string& out, const Json& m) {
  const Json& p = m["progress"];
  int64_t shards = 0;
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 4 && name.substr(name.size() - 4) == ".tmp") return true;
    if (Contains(name, ".shard-")) ++shards;
  }
  if (shards > static_cast<int64_t>(m["files"].size())) return true;
  if (static_cast<int64_t>(fs::file_size(out + "/rows.jsonl")) >
      p["rows_file_bytes"].get<int64_t>())
    return true;
  const int64_t rows = p["rows_committed"];
  std::map<std::string, int64_t> npy;  // file -> committed rows
  for (const auto& a : m["arrays"]) {
    if (!a.contains("file")) continue;  // safetensors
    const std::string file = a["file"];
    npy[file] = a.contains("offsets_file")
                    ? p["ragged_rows"][file].get<int64_t>()
                    : rows;
    if (a.contains("offsets_file")) npy[a["offsets_file"]] = rows + 1;
  }
  for (const auto& [file, committed] : npy) {
    const auto h = ReadNpyHeader(out + "/" + file);
    if (!h.ok()) return true;
    int64_t row_bytes = DTypeSize(h->dtype);
    for (size_t d = 1; d < h->shape.size(); ++d) row_bytes *= h->shape[d];
    if (h->shape[0] > committed ||
        static_cast<int64_t>(fs::file_size(out + "/" + file)) >
            h->data_offset + committed * row_bytes)
      return true;
  }
  return false;
}

// Where a SIGKILL landed.
enum class Landed {
  kBeforeManifest,  // before the job's first manifest (a fresh start redoes it)
  kMidRun,          // an incomplete job that --resume continues
  kAfterCompletion,  // the job had finished
};

struct Tally {
  int kills = 0;
  int before_manifest = 0;
  int mid_run = 0;
  int after_completion = 0;
  int inside_commit = 0;  // mid-run kills that left uncommitted bytes
  int resume_kills = 0;   // kills of a --resume process
  int resumes_killed_mid_run = 0;
  void Record(const std::string& prefix) const {
    const std::pair<const char*, int> counts[] = {
        {"kills", kills},
        {"killed_before_manifest", before_manifest},
        {"killed_mid_run", mid_run},
        {"killed_after_completion", after_completion},
        {"killed_inside_a_commit", inside_commit},
        {"resume_kills", resume_kills},
        {"resumes_killed_mid_run", resumes_killed_mid_run}};
    for (const auto& [name, n] : counts)
      ::testing::Test::RecordProperty(prefix + name, n);
  }
};

// Scratch directories: on a tmpfs (/dev/shm) when there is one, so that a
// job's run is compute, not fsync waits (quicker, and not at the mercy of
// other load on the disk). A SIGKILL leaves the same files on any file system
// (the page cache outlives the process; fsync matters for a power loss, which
// no test here causes). The kill chains run in the default temporary
// directory instead, a disk where fsync takes time, so that kills land inside
// commits there too.
std::string ScratchBase() {
  std::error_code ec;
  if (fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0)
    return "/dev/shm";
  return fs::temp_directory_path().string();
}

// Puts this process, once, in a private mount namespace (and, when it is not
// root, in a user namespace where it is), so that it may mount a tmpfs that
// its children see and that goes away with it. "" on success, else why not.
const std::string& EnterMountNamespace() {
  static const std::string why_not = []() -> std::string {
    const uid_t uid = ::geteuid();
    const gid_t gid = ::getegid();
    const int flags = CLONE_NEWNS | (uid == 0 ? 0 : CLONE_NEWUSER);
    if (::unshare(flags) != 0)
      return std::string("unshare(") +
             (uid == 0 ? "CLONE_NEWNS" : "CLONE_NEWUSER | CLONE_NEWNS") +
             "): " + std::strerror(errno) +
             (uid == 0 ? ""
                       : " (a user namespace needs a single-threaded "
                         "process: run this test alone)");
    if (uid != 0) {
      const std::pair<const char*, std::string> maps[] = {
          {"/proc/self/setgroups", "deny"},
          {"/proc/self/uid_map", "0 " + std::to_string(uid) + " 1"},
          {"/proc/self/gid_map", "0 " + std::to_string(gid) + " 1"}};
      for (const auto& [file, text] : maps) {
        std::ofstream f(file);
        f << text;
        f.flush();
        if (!f) return std::string("cannot write ") + file;
      }
    }
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
      return std::string("making / private: ") + std::strerror(errno);
    return "";
  }();
  return why_not;
}

class ExtractFaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string name =
        "loom_faults_" + std::to_string(::getpid()) + "_" +
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = ScratchBase() + "/" + name;
    disk_dir_ = fs::temp_directory_path().string() + "/" + name + "_disk";
    for (const std::string& d : {dir_, disk_dir_}) {
      fs::remove_all(d);
      fs::create_directories(d);
    }
  }
  void TearDown() override {
    for (const std::string& m : mounts_) ::umount2(m.c_str(), MNT_DETACH);
    for (const std::string& d : {dir_, disk_dir_}) {
      std::error_code ec;
      for (const auto& e : fs::recursive_directory_iterator(d, ec))
        if (e.is_directory(ec))
          fs::permissions(e.path(), fs::perms::owner_all, fs::perm_options::add,
                          ec);
      fs::remove_all(d, ec);
    }
  }

  // Mounts a tmpfs of `bytes` at `dir` (created); "" or why it cannot.
  std::string MountTmpfs(const std::string& dir, int64_t bytes) {
    if (const std::string& why = EnterMountNamespace(); !why.empty())
      return why;
    fs::create_directories(dir);
    const std::string size = "size=" + std::to_string(bytes);
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, size.c_str()) != 0)
      return std::string("mount -t tmpfs: ") + std::strerror(errno);
    mounts_.push_back(dir);
    return "";
  }
  // Remounts the tmpfs at `dir` with `flags` (MS_RDONLY or 0) and `bytes`.
  void RemountTmpfs(const std::string& dir, unsigned long flags,
                    int64_t bytes) {
    const std::string size = "size=" + std::to_string(bytes);
    ASSERT_EQ(::mount("tmpfs", dir.c_str(), "tmpfs", MS_REMOUNT | flags,
                      size.c_str()),
              0)
        << "remount " << dir << ": " << std::strerror(errno);
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::string DiskPath(const std::string& name) const {
    return disk_dir_ + "/" + name;
  }

  // Runs `job` in `out` to the end (exit 0): the CPU time it used, and the
  // CPU time it had used when its first manifest appeared.
  struct Timing {
    double total = 0;
    double manifest = 0;
  };
  Timing RunToEnd(const Job& job, const std::string& out) {
    const pid_t pid = Spawn(job.Args(out), {.log = out + ".log"});
    Timing t;
    int status = 0;
    rusage usage{};
    bool reaped = false;
    for (t.manifest = -1; t.manifest < 0 && !reaped;) {
      const double cpu = CpuSeconds(pid);
      if (fs::exists(out + "/manifest.json"))
        t.manifest = cpu;
      else if (::wait4(pid, &status, WNOHANG, &usage) == pid)
        reaped = true;
      else
        std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    if (!reaped)
      while (::wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
      }
    t.total = CpuOf(usage);
    const ExitStatus e = Decode(status);
    EXPECT_EQ(e.code, 0) << e.ToString() << ": " << Slurp(out + ".log");
    EXPECT_GE(t.manifest, 0) << "/proc/<pid>/task/*/schedstat is unreadable";
    return t;
  }

  // The reference output of `job` in `ref`, and its timing: the least CPU
  // time of three runs (the same job's CPU time varies by some 20% with
  // other load on the machine; an estimate from a slow run would put kill
  // points past the end of faster ones). The other runs must give the same
  // bytes.
  Timing Reference(const Job& job, const std::string& ref, Files* files) {
    Timing best = RunToEnd(job, ref);
    *files = Snapshot(ref);
    for (const char* again : {"_again1", "_again2"}) {
      const Timing t = RunToEnd(job, ref + again);
      EXPECT_EQ(Diff(Snapshot(ref + again), *files), "")
          << "two uninterrupted runs differ";
      fs::remove_all(ref + again);
      best.total = std::min(best.total, t.total);
      best.manifest = std::min(best.manifest, t.manifest);
    }
    RecordProperty("cpu_ms", static_cast<int>(best.total * 1000));
    RecordProperty("manifest_after_cpu_ms",
                   static_cast<int>(best.manifest * 1000));
    return best;
  }

  // Starts `job` in `out` (with --resume when it has a manifest, else fresh)
  // and SIGKILLs it when it has used `cpu` seconds of CPU time, or, with
  // `after_own_manifest` on a fresh start, `cpu` seconds after its manifest
  // appeared (its own start-up, not the reference's: that one varies by
  // tens of ms on a loaded machine). A run that ends first sets
  // `*ended_after` to the CPU time it took.
  Landed StartAndKill(const Job& job, const std::string& out, double cpu,
                      Tally* tally, double* ended_after = nullptr,
                      bool after_own_manifest = false) {
    const bool resume = fs::exists(out + "/manifest.json");
    const pid_t pid = Spawn(job.Args(out, resume), {.log = out + ".log"});
    int status = 0;
    rusage usage{};
    bool reaped = false;
    bool waiting = after_own_manifest && !resume;
    double deadline = cpu;
    while (true) {
      const double used = CpuSeconds(pid);
      if (waiting && fs::exists(out + "/manifest.json")) {
        deadline = used + cpu;
        waiting = false;
      }
      if (!waiting && used >= deadline) break;
      if (::wait4(pid, &status, WNOHANG, &usage) == pid) {
        reaped = true;  // ended before the kill point
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    if (!reaped) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    } else if (ended_after != nullptr) {
      *ended_after = CpuOf(usage);
    }
    const ExitStatus e = Decode(status);
    ++tally->kills;
    if (resume) ++tally->resume_kills;
    Landed landed = Landed::kAfterCompletion;
    if (!e.signaled) {
      EXPECT_EQ(e.code, 0) << "the job failed: " << Slurp(out + ".log");
    } else if (const std::optional<Json> m = ReadManifest(out); !m) {
      EXPECT_FALSE(resume) << "a killed --resume lost its manifest";
      landed = Landed::kBeforeManifest;
    } else if (!(*m)["complete"].get<bool>()) {
      landed = Landed::kMidRun;
      if (KilledInsideCommit(out, *m)) ++tally->inside_commit;
      if (resume) ++tally->resumes_killed_mid_run;
    }
    (landed == Landed::kBeforeManifest ? tally->before_manifest
     : landed == Landed::kMidRun       ? tally->mid_run
                                       : tally->after_completion) += 1;
    return landed;
  }

  // Completes an interrupted job (--resume, or a fresh start when it was
  // killed before its first manifest) and compares every file with `ref`.
  void FinishAndCompare(const Job& job, const std::string& out,
                        const Files& ref, const std::string& what) {
    const bool resume = fs::exists(out + "/manifest.json");
    const ExitStatus e = RunLoom(job.Args(out, resume), {.log = out + ".log"});
    ASSERT_EQ(e.code, 0) << what << ": " << e.ToString() << ": "
                         << Slurp(out + ".log");
    EXPECT_EQ(Diff(Snapshot(out), ref), "") << what;
  }

  // Kills `points` runs of `job` at CPU times drawn from a seeded RNG, one
  // in each of `points` equal slices of [start, duration] (start: 3/4 of the
  // reference's start-up, so that a few kills land before the manifest and
  // most while the job runs, whatever share of the run the start-up takes),
  // then resumes each. A run that ends before its kill point shows the job
  // takes less CPU time than `duration`: the later points are drawn over
  // what it took.
  Tally KillAtRandomPoints(const Job& job, const std::string& base,
                           const Files& ref, const Timing& timing, int points,
                           uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    Tally tally;
    std::string at;
    double duration = timing.total;
    const double start = 0.75 * timing.manifest;
    for (int k = 0; k < points; ++k) {
      const double cpu =
          start + std::max(0.0, duration - start) * (k + u(rng)) / points;
      at += std::to_string(static_cast<int>(cpu * 1000)) + " ";
      const std::string out = base + "/kill" + std::to_string(k);
      double ended_after = duration;
      StartAndKill(job, out, cpu, &tally, &ended_after);
      duration = std::min(duration, ended_after);
      FinishAndCompare(job, out, ref,
                       "killed at " + std::to_string(cpu) + " s + resume");
      fs::remove_all(out);
    }
    RecordProperty("seed", std::to_string(seed));
    RecordProperty("kill_points_cpu_ms", at);
    RecordProperty("last_duration_cpu_ms", static_cast<int>(duration * 1000));
    return tally;
  }

  // Chains: the job killed, its --resume killed, that one's --resume
  // killed, then a final --resume. Each kill comes after the start-up (the
  // CPU time until a manifest appeared) plus 5-20% of the rest, so the
  // three runs together do at most 60% of the whole job and every resume
  // is killed while it runs (at 10-30% the resumes of an ASan build under
  // load finished first in half the chains once the test binaries stopped
  // spinning: the reference's CPU time is a noisier estimate there).
  Tally KillChains(const Job& job, const std::string& base, const Files& ref,
                   const Timing& timing, int chains, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> share(0.05, 0.2);
    Tally tally;
    for (int c = 0; c < chains; ++c) {
      const std::string out = base + "/chain" + std::to_string(c);
      std::string what = "chain " + std::to_string(c) + ": killed at";
      for (int step = 0; step < 3; ++step) {
        // The first run: after its own manifest appeared.
        const double rest = share(rng) * (timing.total - timing.manifest);
        const double cpu = step == 0 ? rest : timing.manifest + rest;
        what += " " + std::to_string(cpu) + " s" +
                (step == 0 ? " after its manifest" : "");
        StartAndKill(job, out, cpu, &tally, nullptr, step == 0);
      }
      FinishAndCompare(job, out, ref, what + ", then resumed");
      fs::remove_all(out);
    }
    return tally;
  }

  std::string dir_;
  std::string disk_dir_;
  std::vector<std::string> mounts_;
};

constexpr uint64_t kSeed = 20240613;

// .npy arrays (a fixed, a reduced and a ragged selector): 24 kill points over
// the whole run, each followed by --resume.
TEST_F(ExtractFaultsTest, SigkillAtManyRandomPointsThenResumeIsByteIdentical) {
  Spit(Path("in.txt"), Prompts(200));
  const Job job = MakeJob(Path("in.txt"), /*safetensors=*/false);
  Files ref;
  const Timing timing = Reference(job, Path("ref"), &ref);
  const int kPoints = 24;
  const Tally t =
      KillAtRandomPoints(job, dir_, ref, timing, kPoints, kSeed);
  t.Record("");
  // The kills must mostly land while the job runs, or little was tested.
  EXPECT_GT(t.mid_run * 2, kPoints)
      << "only " << t.mid_run << " of " << kPoints << " kills landed mid-run ("
      << t.before_manifest << " before the "
      << "manifest, " << t.after_completion << " after completion)";
}

// Kills of the resumes themselves, in the default temporary directory (a
// disk, where a kill often lands inside a commit's fsyncs).
TEST_F(ExtractFaultsTest, KilledResumesChainToByteIdenticalOutput) {
  // Enough rows that a run's CPU time is some 0.3 s (Release) past its
  // start-up: kill points a few ms apart are not told apart by the polling.
  Spit(DiskPath("in.txt"), Prompts(360));
  const Job job = MakeJob(DiskPath("in.txt"), /*safetensors=*/false);
  Files ref;
  const Timing timing = Reference(job, DiskPath("ref"), &ref);
  const int kChains = 2;
  const Tally t = KillChains(job, disk_dir_, ref, timing, kChains, kSeed);
  t.Record("");
  EXPECT_EQ(t.resume_kills, 2 * kChains)
      << "a chain's first kill landed before its manifest";
  EXPECT_GT(t.resumes_killed_mid_run * 2, t.resume_kills)
      << "most resumes finished before they were killed";
}

// Safetensors shards (written whole and renamed, removed past the commit on
// resume) with a ragged selector: random points and a chain.
TEST_F(ExtractFaultsTest, SafetensorsSigkillAndResumeIsByteIdentical) {
  Spit(Path("in.txt"), Prompts(240));
  const Job job = MakeJob(Path("in.txt"), /*safetensors=*/true);
  Files ref;
  const Timing timing = Reference(job, Path("ref"), &ref);
  const int kPoints = 12;
  const Tally t =
      KillAtRandomPoints(job, dir_, ref, timing, kPoints, kSeed + 1);
  t.Record("");
  EXPECT_GT(t.mid_run * 2, kPoints)
      << "only " << t.mid_run << " of " << kPoints << " kills landed mid-run";
  // Two chains (four killed resumes): most must be killed mid-run (one
  // finishing first under a loaded machine is timing, not a fault).
  const Tally c = KillChains(job, dir_, ref, timing, 2, kSeed + 2);
  c.Record("chain_");
  EXPECT_GT(c.resumes_killed_mid_run * 2, c.resume_kills)
      << "most resumes finished before they were killed";
}

// A job that a test stops (SIGSTOP) in the middle: started fresh in `out`,
// stopped once its manifest exists; fails the test unless it is then stopped
// mid-run (manifest not complete).
pid_t StartAndStopMidRun(const Job& job, const std::string& out) {
  const pid_t pid = Spawn(job.Args(out), {.log = out + ".log"});
  const std::optional<ExitStatus> early =
      WaitForFileOrExit(out + "/manifest.json", pid);
  EXPECT_FALSE(early.has_value())
      << "the job ended (" << early->ToString()
      << ") before its manifest appeared: " << Slurp(out + ".log");
  if (early) return -1;
  ::kill(pid, SIGSTOP);
  const std::optional<Json> m = ReadManifest(out);
  EXPECT_TRUE(m && !(*m)["complete"].get<bool>())
      << "the job was stopped only after it completed; use a longer input";
  if (!m || (*m)["complete"].get<bool>()) {
    ::kill(pid, SIGKILL);
    Wait(pid);
    return -1;
  }
  return pid;
}

// A second process on the --out of a running job, fresh or --resume, is
// refused before it touches a file, naming the directory and the holder;
// the first job then completes as if alone.
TEST_F(ExtractFaultsTest, SecondProcessOnTheSameOutIsRefused) {
  Spit(Path("in.txt"), Prompts(320));
  for (const bool safetensors : {false, true}) {
    const std::string fmt = safetensors ? "safetensors" : "npy";
    SCOPED_TRACE(fmt);
    const Job job = MakeJob(Path("in.txt"), safetensors);
    const std::string out = Path("out_" + fmt);
    RunToEnd(job, Path("ref_" + fmt));
    const Files ref = Snapshot(Path("ref_" + fmt));
    const pid_t first = StartAndStopMidRun(job, out);
    ASSERT_GT(first, 0);
    const Files before = Snapshot(out);
    for (const bool resume : {false, true}) {
      const std::string log =
          Path(fmt + (resume ? "_resume.log" : "_fresh.log"));
      const ExitStatus e = RunLoom(job.Args(out, resume), {.log = log});
      const std::string text = Slurp(log);
      EXPECT_EQ(e.code, 1) << e.ToString() << ": " << text;
      for (const std::string& part : std::vector<std::string>{
               "loom extract: --out " + out + ":", "another loom process",
               out + "/.lock", "nothing was changed"})
        EXPECT_TRUE(Contains(text, part))
            << (resume ? "--resume" : "fresh") << ": expected \"" << part
            << "\" in: " << text;
      EXPECT_EQ(Diff(Snapshot(out), before), "")
          << "the refused " << (resume ? "--resume" : "start")
          << " changed files";
    }
    ::kill(first, SIGCONT);
    const ExitStatus e = Wait(first);
    EXPECT_EQ(e.code, 0) << e.ToString() << ": " << Slurp(out + ".log");
    EXPECT_EQ(Diff(Snapshot(out), ref), "");
  }
}

// The file of `out` that a failed job's message names ("<out>/<name>: ..."),
// without a ".tmp" suffix; "" if none.
std::string NamedFile(const std::string& log, const std::string& out) {
  const size_t at = log.find(out + "/");
  if (at == std::string::npos) return "";
  const size_t begin = at + out.size() + 1;
  std::string name = log.substr(begin, log.find(':', begin) - begin);
  if (name.size() > 4 && name.substr(name.size() - 4) == ".tmp")
    name.resize(name.size() - 4);
  return name;
}

// After a job that failed in the middle (or, `at_completion`, while it
// marked itself complete): manifest.json parses, is not complete and commits
// 0 < rows < `total` (rows == `total`); every array's committed rows and
// rows.jsonl's committed bytes are the reference's first ones.
void ExpectCommittedPrefix(const std::string& out, const std::string& ref,
                           int64_t total, bool at_completion = false) {
  const std::optional<Json> m = ReadManifest(out);
  ASSERT_TRUE(m.has_value()) << "manifest.json does not parse";
  EXPECT_FALSE((*m)["complete"].get<bool>());
  const Json& p = (*m)["progress"];
  const int64_t rows = p["rows_committed"];
  if (at_completion) {
    EXPECT_EQ(rows, total);
  } else {
    EXPECT_GT(rows, 0) << "the failure came before the first commit";
    EXPECT_LT(rows, total) << "the failure came after the last commit";
  }
  std::map<std::string, int64_t> npy;  // file -> committed rows
  for (const auto& a : (*m)["arrays"]) {
    const std::string file = a["file"];
    const bool ragged = a.contains("offsets_file");
    npy[file] = ragged ? p["ragged_rows"][file].get<int64_t>() : rows;
    if (ragged) npy[a["offsets_file"]] = rows + 1;
  }
  EXPECT_EQ(npy.size(), 7u);  // 2 hooks x 3 selectors + one offsets file
  for (const auto& [file, committed] : npy) {
    SCOPED_TRACE(file);
    const auto h = ReadNpyHeader(out + "/" + file);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_GE(h->shape[0], committed);
    int64_t row_bytes = DTypeSize(h->dtype);
    for (size_t d = 1; d < h->shape.size(); ++d) row_bytes *= h->shape[d];
    const std::string got = Slurp(out + "/" + file);
    const std::string want = Slurp(ref + "/" + file);
    const size_t n =
        static_cast<size_t>(h->data_offset + committed * row_bytes);
    ASSERT_GE(got.size(), n);
    EXPECT_TRUE(got.compare(h->data_offset, n - h->data_offset, want,
                            h->data_offset, n - h->data_offset) == 0)
        << "committed rows differ from the reference's";
  }
  const size_t bytes = p["rows_file_bytes"].get<size_t>();
  const std::string log = Slurp(out + "/rows.jsonl");
  const std::string want = Slurp(ref + "/rows.jsonl");
  ASSERT_GE(log.size(), bytes);
  EXPECT_EQ(log.substr(0, bytes), want.substr(0, bytes));
  EXPECT_EQ(std::count(want.begin(), want.begin() + bytes, '\n'), rows);
}

// A write past RLIMIT_FSIZE (EFBIG) in the middle of the job: runs the same
// everywhere, needs no privilege, and hits whichever writer grows past the
// limit first. The error names the file and strerror; the last commit stays
// whole; --resume without the limit completes byte-identically.
TEST_F(ExtractFaultsTest, FileSizeLimitMidJobKeepsTheCommitThenResumes) {
  Spit(Path("in.txt"), Prompts(160));
  const Job job = MakeJob(Path("in.txt"), /*safetensors=*/false);
  RunToEnd(job, Path("ref"));
  const Files ref = Snapshot(Path("ref"));
  size_t largest = 0;
  for (const auto& [name, bytes] : ref)
    largest = std::max(largest, bytes.size());
  const rlim_t limit = largest / 2;
  const std::string out = Path("out");
  const ExitStatus e = RunLoom(
      job.Args(out), {.log = Path("limited.log"), .file_size_limit = limit});
  const std::string log = Slurp(Path("limited.log"));
  EXPECT_EQ(e.code, 1) << e.ToString() << ": " << log;
  EXPECT_TRUE(Contains(log, "loom extract: ")) << log;
  EXPECT_TRUE(Contains(log, std::strerror(EFBIG))) << log;
  const std::string named = NamedFile(log, out);
  ASSERT_TRUE(ref.count(named)) << "no file of --out named in: " << log;
  EXPECT_GT(ref.at(named).size(), limit)
      << named << " cannot have hit the limit";
  ExpectCommittedPrefix(out, Path("ref"), 160);
  const ExitStatus resumed =
      RunLoom(job.Args(out, /*resume=*/true), {.log = Path("resume.log")});
  EXPECT_EQ(resumed.code, 0) << Slurp(Path("resume.log"));
  EXPECT_EQ(Diff(Snapshot(out), ref), "");
}

// A file system that fills up during the job (a small tmpfs as --out): at
// 30% and 70% of what the job needs, ENOSPC comes at whichever write
// finds no page (an array, rows.jsonl or the manifest); with all but two
// pages, at the last commit, which marks the job complete. Each time the
// error names the file and strerror and the last commit stays whole; the
// tmpfs is then grown and --resume completes byte-identically.
TEST_F(ExtractFaultsTest, FullFileSystemKeepsTheCommitThenResumes) {
  Spit(Path("in.txt"), Prompts(160));
  const Job job = MakeJob(Path("in.txt"), /*safetensors=*/false);
  RunToEnd(job, Path("ref"));
  const Files ref = Snapshot(Path("ref"));
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  int64_t pages = 0;  // what the finished job occupies on a tmpfs
  for (const auto& [name, bytes] : ref)
    pages += (static_cast<int64_t>(bytes.size()) + page - 1) / page;
  // The complete manifest (which lists every row) spans several pages: the
  // last commit needs them beside the previous manifest.
  ASSERT_GE(static_cast<int64_t>(ref.at("manifest.json").size()), 4 * page);
  struct Case {
    std::string name;
    int64_t pages;
    bool at_completion;
  };
  const std::vector<Case> cases = {{"30pct", pages * 3 / 10, false},
                                   {"70pct", pages * 7 / 10, false},
                                   {"last_commit", pages - 2, true}};
  std::string hit;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string out = Path("full_" + c.name);
    const std::string why = MountTmpfs(out, c.pages * page);
    if (!why.empty())
      GTEST_SKIP() << "SKIPPED LOUDLY: cannot mount a tmpfs for --out (" << why
                   << "); FileSizeLimitMidJobKeepsTheCommitThenResumes tests "
                      "the same failure through RLIMIT_FSIZE";
    const std::string log_path = Path(c.name + ".log");
    const ExitStatus e = RunLoom(job.Args(out), {.log = log_path});
    const std::string log = Slurp(log_path);
    EXPECT_EQ(e.code, 1) << e.ToString() << ": " << log;
    EXPECT_TRUE(Contains(log, "loom extract: ")) << log;
    EXPECT_TRUE(Contains(log, std::strerror(ENOSPC))) << log;
    const std::string named = NamedFile(log, out);
    EXPECT_TRUE(ref.count(named)) << "no file of --out named in: " << log;
    if (c.at_completion) {
      EXPECT_EQ(named, "manifest.json") << log;
    }
    if (const std::optional<Json> m = ReadManifest(out))
      hit += c.name + ": " + named + " after " +
             (*m)["progress"]["rows_committed"].dump() + " rows; ";
    ExpectCommittedPrefix(out, Path("ref"), 160, c.at_completion);
    RemountTmpfs(out, 0, 2 * pages * page);
    const ExitStatus resumed =
        RunLoom(job.Args(out, /*resume=*/true), {.log = log_path});
    EXPECT_EQ(resumed.code, 0) << Slurp(log_path);
    EXPECT_EQ(Diff(Snapshot(out), ref), "");
  }
  RecordProperty("files_that_found_no_space", hit);
}

// An --out the job may not write (mode 0555; as root, run without
// CAP_DAC_OVERRIDE so the mode applies): an IO error naming the path, exit 1,
// nothing created.
TEST_F(ExtractFaultsTest, ReadOnlyOutDirIsAnIoErrorNamingThePath) {
  Spit(Path("in.txt"), Prompts(4));
  const std::string out = Path("ro");
  fs::create_directories(out);
  fs::permissions(out, fs::perms(0555));
  const ExitStatus e =
      RunLoom(MakeJob(Path("in.txt"), false).Args(out),
              {.log = Path("ro.log"), .obey_permissions = ::geteuid() == 0});
  if (e.code == kCannotDropCaps)
    GTEST_SKIP() << "SKIPPED LOUDLY: running as root without CAP_SETPCAP, so "
                    "file modes cannot be made to apply; "
                    "ReadOnlyFileSystemIsAnIoErrorAndResumeWritesNothing "
                    "covers a read-only --out where a tmpfs can be mounted";
  const std::string log = Slurp(Path("ro.log"));
  EXPECT_EQ(e.code, 1) << e.ToString() << ": " << log;
  EXPECT_TRUE(Contains(log, "loom extract: --out " + out + ": " + out +
                                "/.lock: open: " + std::strerror(EACCES)))
      << log;
  EXPECT_TRUE(fs::is_empty(out));
}

// A read-only file system (a tmpfs remounted ro): a fresh start is an IO
// error naming the path; so is a --resume, which leaves every file as it was;
// once writable again, --resume completes byte-identically.
TEST_F(ExtractFaultsTest, ReadOnlyFileSystemIsAnIoErrorAndResumeWritesNothing) {
  Spit(Path("in.txt"), Prompts(160));
  const Job job = MakeJob(Path("in.txt"), /*safetensors=*/false);
  RunToEnd(job, Path("ref"));
  const Files ref = Snapshot(Path("ref"));
  const int64_t size = 64 << 20;
  const std::string fresh = Path("fresh");
  const std::string why = MountTmpfs(fresh, size);
  if (!why.empty())
    GTEST_SKIP() << "SKIPPED LOUDLY: cannot mount a tmpfs (" << why
                 << "); ReadOnlyOutDirIsAnIoErrorNamingThePath tests a "
                    "read-only --out with file modes";
  RemountTmpfs(fresh, MS_RDONLY, size);
  ExitStatus e = RunLoom(job.Args(fresh), {.log = Path("fresh.log")});
  std::string log = Slurp(Path("fresh.log"));
  EXPECT_EQ(e.code, 1) << e.ToString() << ": " << log;
  EXPECT_TRUE(Contains(log, "loom extract: --out " + fresh + ": " + fresh +
                                "/.lock: open: " + std::strerror(EROFS)))
      << log;
  EXPECT_TRUE(fs::is_empty(fresh));

  const std::string out = Path("out");
  ASSERT_EQ(MountTmpfs(out, size), "");
  const pid_t pid = StartAndStopMidRun(job, out);
  ASSERT_GT(pid, 0);
  ::kill(pid, SIGKILL);
  Wait(pid);
  RemountTmpfs(out, MS_RDONLY, size);
  const Files before = Snapshot(out);
  e = RunLoom(job.Args(out, /*resume=*/true), {.log = Path("resume_ro.log")});
  log = Slurp(Path("resume_ro.log"));
  EXPECT_EQ(e.code, 1) << e.ToString() << ": " << log;
  EXPECT_TRUE(Contains(log, std::strerror(EROFS))) << log;
  EXPECT_TRUE(ref.count(NamedFile(log, out))) << log;
  EXPECT_EQ(Diff(Snapshot(out), before), "");
  RemountTmpfs(out, 0, size);
  e = RunLoom(job.Args(out, /*resume=*/true), {.log = Path("resume.log")});
  EXPECT_EQ(e.code, 0) << Slurp(Path("resume.log"));
  EXPECT_EQ(Diff(Snapshot(out), ref), "");
}

// --out removed (rm -rf) while the job runs: writes through descriptors it
// already holds still succeed (into unlinked files), the next path it opens
// by name fails -- a file in --out ("<out>/rows.jsonl.tmp: open: ...") or,
// when the stop landed just before a commit's directory sync, --out itself
// ("<out>: open: ..."); the job reports that path and exits 1, never
// crashes, and never recreates the directory.
TEST_F(ExtractFaultsTest, OutDirRemovedWhileRunningIsAnErrorNotACrash) {
  Spit(Path("in.txt"), Prompts(320));
  const Job job = MakeJob(Path("in.txt"), /*safetensors=*/false);
  const std::string out = Path("out");
  const pid_t pid = StartAndStopMidRun(job, out);
  ASSERT_GT(pid, 0);
  fs::remove_all(out);
  EXPECT_FALSE(fs::exists(out));  // (no ASSERT: the job must be continued)
  ::kill(pid, SIGCONT);
  const ExitStatus e = Wait(pid);
  const std::string log = Slurp(out + ".log");
  EXPECT_FALSE(e.signaled) << "the job crashed: " << log;
  EXPECT_EQ(e.code, 1) << e.ToString() << ": " << log;
  EXPECT_TRUE(Contains(log, "loom extract: ")) << log;
  EXPECT_TRUE(Contains(log, out + "/") || Contains(log, out + ": ")) << log;
  EXPECT_TRUE(Contains(log, std::strerror(ENOENT))) << log;
  EXPECT_FALSE(fs::exists(out));
}

// --resume never creates --out: a missing one is NOT_FOUND naming it, from
// the library and from the CLI (exit 1). (After the tests that mount: this
// one runs the job in this process, whose threads would then keep a non-root
// run of the whole binary out of a user namespace.)
TEST_F(ExtractFaultsTest, ResumeOnAMissingOutDirIsNotFound) {
  Spit(Path("in.txt"), Prompts(4));
  const std::string out = Path("never_created");
  ExtractOptions o;
  o.model_dir = kModel;
  o.input_path = Path("in.txt");
  o.out_dir = out;
  o.hooks = {"blocks.0.hook_resid_post"};
  o.resume = true;
  const auto s = RunExtract(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound) << s.status().ToString();
  EXPECT_EQ(s.status().message(),
            "--resume: --out " + out + " does not exist (nothing to resume)");
  EXPECT_FALSE(fs::exists(out));
  const ExitStatus e =
      RunLoom(MakeJob(Path("in.txt"), false).Args(out, /*resume=*/true),
              {.log = Path("cli.log")});
  EXPECT_EQ(e.code, 1) << e.ToString();
  EXPECT_TRUE(
      Contains(Slurp(Path("cli.log")),
               "loom extract: --resume: --out " + out + " does not exist"))
      << Slurp(Path("cli.log"));
  EXPECT_FALSE(fs::exists(out));
}

// An intervention whose rows lie past the input would edit nothing: refused
// before anything is loaded or written (it used to run, editing no row).
TEST_F(ExtractFaultsTest, InterventionRowsPastTheInputAreRefused) {
  Spit(Path("in.txt"), Prompts(4));
  ExtractOptions o;
  o.model_dir = kModel;
  o.input_path = Path("in.txt");
  o.out_dir = Path("rows_out");
  o.hooks = {"blocks.0.hook_resid_post"};
  o.interventions_json =
      R"({"interventions": [{"hook": "blocks.0.hook_resid_post",
                             "mode": "zero", "rows": [1, 4]}]})";
  auto s = RunExtract(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "interventions: the zero at blocks.0.hook_resid_post lists row 4 "
            "in `rows`, but this job has 4 input rows (rows count from 0): it "
            "would edit nothing");
  EXPECT_FALSE(fs::exists(o.out_dir));
  o.interventions_json =
      R"({"interventions": [{"hook": "blocks.0.hook_resid_post",
                             "mode": "zero", "rows": [3]}]})";
  EXPECT_TRUE(RunExtract(o).ok());
}

// ---- Damaged commit records
// --------------------------------------------------

// A job stopped after 4 commits of 3 rows (12 of 20), run in this process;
// then its rows.jsonl or manifest.json is damaged and --resume must refuse
// with DATA_LOSS naming the file and where, changing no file.
class ExtractDamageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ScratchBase() + "/loom_damage_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::string text;
    for (int i = 0; i < 20; ++i)
      text += "Ann has " + std::to_string(i) + " green cups.\n";
    Spit(dir_ + "/in.txt", text);
    o_.model_dir = kModel;
    o_.input_path = dir_ + "/in.txt";
    o_.out_dir = dir_ + "/out";
    o_.hooks = {"blocks.0.hook_resid_post"};
    o_.selectors = {"last", "all"};
    o_.commit_every = 3;
    ExtractOptions o = o_;
    o.stop_after_commits = 4;
    const auto s = RunExtract(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_EQ(s->rows, 12);
    rows_ = Slurp(RowsPath());
    manifest_ = Slurp(ManifestPath());
    const Json m = Json::parse(manifest_);
    committed_ = m["progress"]["rows_file_bytes"];
    crc_ = m["progress"]["rows_file_crc32"];
    ASSERT_EQ(committed_, rows_.size());
    for (size_t at = 0; at < rows_.size(); at = rows_.find('\n', at) + 1)
      line_start_.push_back(at);
    ASSERT_EQ(line_start_.size(), 12u);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string RowsPath() const { return o_.out_dir + "/rows.jsonl"; }
  std::string ManifestPath() const { return o_.out_dir + "/manifest.json"; }
  // Line i of the committed rows.jsonl (0-based), with its newline.
  std::string Line(size_t i) const {
    const size_t end =
        i + 1 < line_start_.size() ? line_start_[i + 1] : rows_.size();
    return rows_.substr(line_start_[i], end - line_start_[i]);
  }

  // --resume fails with DATA_LOSS and a message holding every `parts`, and
  // no file of the job changed. Returns the message.
  std::string ExpectResumeFails(const std::vector<std::string>& parts) {
    const Files before = Snapshot(o_.out_dir);
    ExtractOptions r = o_;
    r.resume = true;
    const auto s = RunExtract(r);
    EXPECT_FALSE(s.ok()) << "the damaged job resumed";
    if (s.ok()) return "";
    EXPECT_EQ(s.status().code(), StatusCode::kDataLoss)
        << s.status().ToString();
    for (const std::string& p : parts)
      EXPECT_TRUE(Contains(s.status().message(), p))
          << "expected \"" << p << "\" in: " << s.status().message();
    EXPECT_EQ(Diff(Snapshot(o_.out_dir), before), "")
        << "the failed resume changed files";
    return s.status().message();
  }
  // Resuming completes the job byte-identical to an uninterrupted run.
  void ExpectResumeMatchesUninterrupted() {
    ExtractOptions ref = o_;
    ref.out_dir = dir_ + "/ref";
    ASSERT_TRUE(RunExtract(ref).ok());
    ExtractOptions r = o_;
    r.resume = true;
    const auto s = RunExtract(r);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->rows, 20);
    EXPECT_EQ(Diff(Snapshot(o_.out_dir), Snapshot(ref.out_dir)), "");
  }
  std::string At(size_t offset, size_t line) const {
    return RowsPath() + ": byte offset " + std::to_string(offset) + " (line " +
           std::to_string(line) + "): ";
  }

  std::string dir_;
  ExtractOptions o_;
  std::string rows_, manifest_;
  size_t committed_ = 0;
  uint32_t crc_ = 0;
  std::vector<size_t> line_start_;
};

// rows.jsonl cut anywhere inside its committed bytes names the offset where
// it now ends; cut after them (an append the kill interrupted), it resumes.
TEST_F(ExtractDamageTest, TruncatedRowsLogIsDataLossAtTheOffset) {
  const size_t mid_line = line_start_[5] + Line(5).size() / 2;
  for (const size_t cut :
       {size_t{0}, size_t{1}, line_start_[5], mid_line, committed_ - 1}) {
    SCOPED_TRACE(cut);
    Spit(RowsPath(), rows_.substr(0, cut));
    ExpectResumeFails({RowsPath() + " has " + std::to_string(cut) + " bytes",
                       "the manifest commits " + std::to_string(committed_),
                       "(truncated: it ends at byte offset " +
                           std::to_string(cut) + ", in line "});
  }
  // Bytes after the commit are what an interrupted append leaves: cut off.
  Spit(RowsPath(), rows_ + Line(3).substr(0, 9));
  ExpectResumeMatchesUninterrupted();
}

// Lines swapped, duplicated, deleted, broken or with a changed field: the
// first line that is not the record of its row is named with its offset.
TEST_F(ExtractDamageTest, EditedRowsLogIsDataLossNamingTheLine) {
  struct Case {
    std::string name;
    std::string rows;
    std::vector<std::string> parts;
  };
  const auto replace = [&](size_t line, const std::string& from,
                           const std::string& to) {
    std::string l = Line(line);
    const size_t at = l.find(from);
    EXPECT_NE(at, std::string::npos) << from << " in " << l;
    if (at != std::string::npos) l.replace(at, from.size(), to);
    return rows_.substr(0, line_start_[line]) + l +
           rows_.substr(line_start_[line] + Line(line).size());
  };
  const std::vector<Case> cases = {
      {"swapped",
       rows_.substr(0, line_start_[2]) + Line(3) + Line(2) +
           rows_.substr(line_start_[4]),
       {At(line_start_[2], 3) + "expected row 2, found 3"}},
      {"duplicated",
       rows_.substr(0, line_start_[4]) + Line(3) + rows_.substr(line_start_[4]),
       {At(line_start_[4], 5) + "expected row 4, found 3"}},
      {"deleted",
       rows_.substr(0, line_start_[3]) + rows_.substr(line_start_[4]),
       {At(line_start_[3], 4) + "expected row 3, found 4"}},
      {"renamed_field",
       replace(5, "\"status\"", "\"sta_us\""),
       {At(line_start_[5], 6) + "unexpected field 'sta_us'"}},
      {"changed_status",
       replace(7, "\"ok\"", "\"no\""),
       {At(line_start_[7], 8) + "expected status \"ok\""}},
      {"row_digit",
       replace(9, "\"row\":9", "\"row\":8"),
       {At(line_start_[9], 10) + "expected row 9, found 8"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Spit(RowsPath(), c.rows);
    ExpectResumeFails(c.parts);
  }
  // Not JSON: the offset is where the parser stopped, inside line 5.
  Spit(RowsPath(), replace(4, "\"row\":", "\"row\" "));
  const std::string message = ExpectResumeFails({" (line 5): not JSON: "});
  const size_t at = message.find("byte offset ");
  ASSERT_NE(at, std::string::npos) << message;
  const size_t offset = std::stoul(message.substr(at + 12));
  EXPECT_GE(offset, line_start_[4]) << message;
  EXPECT_LT(offset, line_start_[5]) << message;
  Spit(RowsPath(), rows_);
  ExpectResumeMatchesUninterrupted();
}

// A byte changed where every line still parses as its row's record (a digit
// of a token count, of an id): only the manifest's crc32 of the committed
// bytes tells; and a byte flipped in the middle of the file is caught
// wherever it lands.
TEST_F(ExtractDamageTest, ChangedByteIsCaughtByTheChecksum) {
  char recorded[16];
  std::snprintf(recorded, sizeof recorded, "0x%08x", crc_);
  const std::string crc_parts = RowsPath() + ": committed bytes [0, " +
                                std::to_string(committed_) + ") have crc32 0x";
  for (const std::string field : {"\"tokens\":", "\"id\":"}) {
    SCOPED_TRACE(field);
    std::string damaged = rows_;
    const size_t at = damaged.find(field, line_start_[6]) + field.size();
    ASSERT_TRUE(std::isdigit(static_cast<unsigned char>(damaged[at])));
    damaged[at] = damaged[at] == '9' ? '8' : static_cast<char>(damaged[at] + 1);
    Spit(RowsPath(), damaged);
    ExpectResumeFails(
        {crc_parts, std::string("the manifest records ") + recorded});
  }
  std::string flipped = rows_;
  flipped[committed_ / 2] ^= 0x01;
  Spit(RowsPath(), flipped);
  const std::string message = ExpectResumeFails({RowsPath() + ": "});
  EXPECT_TRUE(Contains(message, "byte offset ") ||
              Contains(message, "have crc32"))
      << message;
  Spit(RowsPath(), rows_);
  ExpectResumeMatchesUninterrupted();
}

// Counts in the manifest that the committed rows.jsonl does not bear out
// (which a resume used to trust, numbering the next rows from them).
TEST_F(ExtractDamageTest, ManifestCountsThatDisagreeWithRowsLogAreDataLoss) {
  const auto edit = [&](const std::function<void(Json&)>& f) {
    Json m = Json::parse(manifest_);
    f(m);
    Spit(ManifestPath(), m.dump(2) + "\n");
  };
  const std::string range = RowsPath() + ": the committed bytes [0, " +
                            std::to_string(committed_) + ") hold ";
  edit([](Json& m) {
    m["progress"]["rows_committed"] = 11;
    m["progress"]["rows_ok"] = 11;
  });
  ExpectResumeFails({range + "12 rows, the manifest commits 11"});
  edit([&](Json& m) { m["progress"]["rows_file_bytes"] = line_start_[11]; });
  ExpectResumeFails({RowsPath() + ": the committed bytes [0, " +
                     std::to_string(line_start_[11]) +
                     ") hold 11 rows, the manifest commits 12"});
  edit([](Json& m) {
    m["progress"]["rows_ok"] = 11;
    m["progress"]["rows_skipped"] = 1;
  });
  ExpectResumeFails({range + "12 ok and 0 skipped rows, the manifest counts "
                             "11 and 1"});
  edit([&](Json& m) { m["progress"]["rows_file_crc32"] = crc_ ^ 1u; });
  ExpectResumeFails({"have crc32", "(changed after they were committed)"});
  edit([](Json& m) { m["progress"]["rows_file_crc32"] = "0"; });
  ExpectResumeFails({"field progress.rows_file_crc32: expected an integer"});
  edit([](Json& m) { m["progress"]["rows_file_crc32"] = int64_t{1} << 32; });
  ExpectResumeFails(
      {"progress.rows_file_crc32 is 4294967296, expected a "
       "32-bit crc32"});
  Spit(ManifestPath(), manifest_);
  ExpectResumeMatchesUninterrupted();
}

// A manifest written before loom recorded the checksum: the rows are still
// checked line by line, and the resumed job records it from then on, ending
// byte-identical to an uninterrupted run.
TEST_F(ExtractDamageTest, ManifestWithoutChecksumStillResumes) {
  Json m = Json::parse(manifest_);
  m["progress"].erase("rows_file_crc32");
  Spit(ManifestPath(), m.dump(2) + "\n");
  Spit(RowsPath(), rows_.substr(0, line_start_[3]) + Line(4) +
                       rows_.substr(line_start_[4]));
  ExpectResumeFails({At(line_start_[3], 4) + "expected row 3, found 4"});
  Spit(RowsPath(), rows_);
  ExpectResumeMatchesUninterrupted();
}

}  // namespace
}  // namespace loom
