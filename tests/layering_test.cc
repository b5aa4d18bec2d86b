// The layering of docs/design/architecture.md, enforced: reads the table
// between <!-- layering-table --> and <!-- /layering-table --> and checks every
// #include "src/..." / "tools/..." of src/, tools/, bench/, tests/ and python/
// against it. The rules are stated beside the table (docs/design/
// architecture.md, "Layering"); this file holds none of its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Module {
  std::string name;
  std::string path;            // a directory or a file stem
  std::set<std::string> deps;  // may include (besides itself)
  bool anything = false;       // "*"
};

struct Table {
  std::vector<Module> modules;
  std::vector<std::string> errors;  // problems with the table itself
};

std::string Trim(std::string s) {
  const char* ws = " \t`";
  s.erase(0, s.find_first_not_of(ws));
  const size_t end = s.find_last_not_of(ws);
  s.erase(end == std::string::npos ? 0 : end + 1);
  return s;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) out.push_back(item);
  return out;
}

// Parses the markdown table between the markers.
Table ParseTable(const std::string& doc) {
  Table t;
  const std::string open = "<!-- layering-table -->",
                    close = "<!-- /layering-table -->";
  const size_t a = doc.find(open), b = doc.find(close);
  if (a == std::string::npos || b == std::string::npos || b < a) {
    t.errors.push_back("no " + open + " ... " + close + " section");
    return t;
  }
  std::stringstream in(doc.substr(a + open.size(), b - a - open.size()));
  std::string line;
  int row = 0;
  while (std::getline(in, line)) {
    line = Trim(line);
    if (line.empty() || line[0] != '|') continue;
    if (row++ < 2) continue;  // header and |---| separator
    std::vector<std::string> cells = Split(line, '|');
    // "| a | b | c |" -> "", a, b, c (a trailing empty cell is dropped).
    if (cells.size() < 4) {
      t.errors.push_back("row '" + line +
                         "': expected | module | path | "
                         "may include |");
      continue;
    }
    Module m;
    m.name = Trim(cells[1]);
    m.path = Trim(cells[2]);
    for (const std::string& d : Split(cells[3], ',')) {
      const std::string dep = Trim(d);
      if (dep == "*")
        m.anything = true;
      else if (!dep.empty())
        m.deps.insert(dep);
    }
    t.modules.push_back(m);
  }
  std::set<std::string> names, paths;
  for (const Module& m : t.modules) {
    if (!names.insert(m.name).second)
      t.errors.push_back("module '" + m.name + "' has two rows");
    if (!paths.insert(m.path).second)
      t.errors.push_back("path '" + m.path + "' has two rows");
  }
  for (const Module& m : t.modules)
    for (const std::string& d : m.deps)
      if (!names.count(d))
        t.errors.push_back("module '" + m.name + "' lists unknown module '" +
                           d + "'");
  // No cycles: depth-first search over the listed edges.
  std::map<std::string, int> state;  // 1 on the stack, 2 done
  std::map<std::string, const Module*> by_name;
  for (const Module& m : t.modules) by_name[m.name] = &m;
  std::vector<std::string> stack;
  std::function<void(const std::string&)> visit = [&](const std::string& n) {
    state[n] = 1;
    stack.push_back(n);
    if (by_name.count(n))
      for (const std::string& d : by_name[n]->deps) {
        if (d == n) continue;
        if (state[d] == 1) {
          std::string cycle;
          for (auto it = std::find(stack.begin(), stack.end(), d);
               it != stack.end(); ++it)
            cycle += *it + " -> ";
          t.errors.push_back("cycle: " + cycle + d);
        } else if (state[d] == 0) {
          visit(d);
        }
      }
    stack.pop_back();
    state[n] = 2;
  };
  for (const Module& m : t.modules)
    if (state[m.name] == 0) visit(m.name);
  return t;
}

// The row whose path is the longest prefix of `file`, ending at '/' or '.'
// (or the whole path); nullptr when none.
const Module* ModuleOf(const Table& t, const std::string& file) {
  const Module* best = nullptr;
  for (const Module& m : t.modules) {
    const std::string& p = m.path;
    const bool match =
        file == p ||
        (file.size() > p.size() && file.compare(0, p.size(), p) == 0 &&
         (file[p.size()] == '/' || file[p.size()] == '.'));
    if (match && (best == nullptr || p.size() > best->path.size())) best = &m;
  }
  return best;
}

bool IsTestSource(const std::string& file) {
  const std::string base = file.substr(file.rfind('/') + 1);
  return (base.size() > 8 &&
          base.compare(base.size() - 8, 8, "_test.cc") == 0) ||
         base == "test_util.h";
}

struct Source {
  std::string path;  // relative to the repository root
  std::string text;
};

// Every violation of `t` in `sources`, one line each.
std::vector<std::string> Violations(const Table& t,
                                    const std::vector<Source>& sources) {
  std::vector<std::string> out;
  const Module* tests = nullptr;
  for (const Module& m : t.modules)
    if (m.name == "tests") tests = &m;
  const std::regex include_re(
      R"re(^\s*#\s*include\s+"((src|tools|tests|bench)/[^"]+)")re");
  for (const Source& s : sources) {
    const Module* from =
        IsTestSource(s.path) && tests != nullptr ? tests : ModuleOf(t, s.path);
    if (from == nullptr) {
      out.push_back(s.path + " belongs to no module: add a row to the table");
      continue;
    }
    std::stringstream in(s.text);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      std::smatch m;
      if (!std::regex_search(line, m, include_re)) continue;
      const std::string target = m[1];
      const std::string where = s.path + ":" + std::to_string(n);
      const Module* to = ModuleOf(t, target);
      if (to == nullptr) {
        out.push_back(where + " includes \"" + target +
                      "\", which belongs to no module");
        continue;
      }
      if (to == from || from->anything || from->deps.count(to->name)) continue;
      out.push_back(where + ": " + from->name + " includes \"" + target +
                    "\" (" + to->name + "), which its row does not list");
    }
  }
  return out;
}

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Table TheTable() {
  const std::string doc = ReadFile(std::filesystem::path(LOOM_SOURCE_DIR) /
                                   "docs/design/architecture.md");
  return ParseTable(doc);
}

std::string Join(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += "  " + l + "\n";
  return s;
}

TEST(Layering, TheTableIsWellFormed) {
  const Table t = TheTable();
  EXPECT_TRUE(t.errors.empty()) << Join(t.errors);
  // The modules of issue 9's layering, each with a row.
  for (const char* name : {"base", "core", "io", "tokenizer", "model", "plan",
                           "plan/report", "backend", "backend/cpu", "runtime",
                           "eval", "tools", "tests", "bench"}) {
    bool found = false;
    for (const Module& m : t.modules) found |= m.name == name;
    EXPECT_TRUE(found) << "no row for " << name;
  }
}

TEST(Layering, EveryIncludeFollowsTheTable) {
  const Table t = TheTable();
  ASSERT_TRUE(t.errors.empty()) << Join(t.errors);
  const std::filesystem::path root(LOOM_SOURCE_DIR);
  std::vector<Source> sources;
  for (const char* dir : {"src", "tools", "bench", "tests", "python"}) {
    std::error_code ec;
    for (auto it =
             std::filesystem::recursive_directory_iterator(root / dir, ec);
         !ec && it != std::filesystem::recursive_directory_iterator();
         it.increment(ec)) {
      const std::string ext = it->path().extension().string();
      if (!it->is_regular_file() || (ext != ".cc" && ext != ".h")) continue;
      // Test data (tests/data) holds no sources of ours.
      const std::string rel =
          std::filesystem::relative(it->path(), root).generic_string();
      if (rel.rfind("tests/data/", 0) == 0) continue;
      sources.push_back({rel, ReadFile(it->path())});
    }
    ASSERT_FALSE(ec) << dir << ": " << ec.message();
  }
  ASSERT_GT(sources.size(), 100u) << "found too few sources under " << root;
  const std::vector<std::string> bad = Violations(t, sources);
  EXPECT_TRUE(bad.empty())
      << "includes that break docs/design/architecture.md (Layering):\n"
      << Join(bad);
}

// The checker itself: a table and sources in memory.
// The lines of `text`.
int64_t Lines(const std::string& text) {
  return static_cast<int64_t>(std::count(text.begin(), text.end(), '\n'));
}

// The sources (.cc, .h; tests aside) under `dir`, relative path -> text.
std::map<std::string, std::string> SourcesUnder(const std::string& dir) {
  const std::filesystem::path root(LOOM_SOURCE_DIR);
  std::map<std::string, std::string> out;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(root / dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string ext = it->path().extension().string();
    const std::string rel =
        std::filesystem::relative(it->path(), root).generic_string();
    if (!it->is_regular_file() || (ext != ".cc" && ext != ".h") ||
        rel.find("_test.") != std::string::npos ||
        rel.find("/tests/") != std::string::npos)
      continue;
    out[rel] = ReadFile(it->path());
  }
  return out;
}

// The front ends stay translators (docs/design/architecture.md, "Session"):
// the server's lifecycle file and its route files stay small, the Python
// module's registration file too, each flag string is declared once (by the
// parameter table's specs, or one constant), and only the Session's source
// plans, creates backends and loads.
TEST(Layering, TheFrontEndsStayThin) {
  std::map<std::string, std::string> front;
  for (const char* dir : {"tools", "python", "src/serve"})
    front.merge(SourcesUnder(dir));
  ASSERT_GT(front.size(), 20u);
  for (const auto& [path, text] : front) {
    SCOPED_TRACE(path);
    if (path == "src/serve/server.cc") EXPECT_LE(Lines(text), 600);
    if (path.rfind("src/serve/routes/", 0) == 0) EXPECT_LE(Lines(text), 400);
    if (path == "python/loom_module.cc") EXPECT_LE(Lines(text), 700);
  }
  for (const char* flag :
       {"\"--precision\"", "\"--hooks\"", "\"--select\"", "\"--device\"",
        "\"--threads\"", "\"--model\"", "\"--hf-bf16\""}) {
    std::vector<std::string> where;
    for (const auto& [path, text] : front)
      for (size_t at = text.find(flag); at != std::string::npos;
           at = text.find(flag, at + 1))
        where.push_back(path);
    EXPECT_LE(where.size(), 1u) << flag << " is declared in:\n" << Join(where);
  }
  std::map<std::string, std::string> all = SourcesUnder("src");
  all.merge(front);
  for (const char* call : {"PlanJobOrRefuse(", "CreateJobBackends(",
                           "Model::Load(", "LoadInterventions("}) {
    for (const auto& [path, text] : all) {
      if (path.rfind("src/eval/session.", 0) == 0 ||
          path.rfind("src/eval/job_plan", 0) == 0 ||
          path.rfind("src/runtime/model.", 0) == 0 ||
          path.rfind("src/model/interventions.", 0) == 0)
        continue;
      EXPECT_EQ(text.find(call), std::string::npos)
          << path << " calls " << call << " (only the Session does)";
    }
  }
}

TEST(Layering, CatchesForbiddenIncludesAndUnknownPlaces) {
  const Table t = ParseTable(
      "<!-- layering-table -->\n"
      "| module | path | may include |\n|---|---|---|\n"
      "| base | `src/base` | |\n"
      "| plan | `src/plan` | base |\n"
      "| plan/report | `src/plan/report` | base, plan |\n"
      "| backend/cpu | `src/backend/cpu` | base |\n"
      "| eval | `src/eval` | base, plan, plan/report |\n"
      "| tests | `tests` | * |\n"
      "<!-- /layering-table -->\n");
  ASSERT_TRUE(t.errors.empty()) << Join(t.errors);
  const std::vector<Source> ok = {
      {"src/plan/report.cc", "#include \"src/plan/planner.h\"\n"},
      {"src/eval/job_plan.cc",
       "#include \"src/plan/report.h\"\n#include \"src/base/status.h\"\n"},
      {"src/plan/planner_test.cc", "#include \"src/eval/job_plan.h\"\n"},
      {"tests/x.cc", "#include \"src/backend/cpu/kernels.h\"\n"},
  };
  EXPECT_TRUE(Violations(t, ok).empty()) << Join(Violations(t, ok));

  const std::vector<Source> bad = {
      // The planner may not read its report (the loop issue 9 broke).
      {"src/plan/planner.cc",
       "#include <vector>\n#include \"src/plan/report.h\"\n"},
      // Nor may a lower layer reach up, or eval reach the CPU backend.
      {"src/base/status.cc", "#include \"src/plan/job.h\"\n"},
      {"src/eval/perplexity.cc",
       "  #  include \"src/backend/cpu/kernels.h\"\n"},
      // Places the table does not know.
      {"src/newdir/a.cc", "\n"},
      {"src/eval/b.cc", "#include \"src/nowhere/c.h\"\n"},
  };
  const std::vector<std::string> v = Violations(t, bad);
  ASSERT_EQ(v.size(), 5u) << Join(v);
  EXPECT_NE(v[0].find("src/plan/planner.cc:2: plan includes"),
            std::string::npos)
      << v[0];
  EXPECT_NE(v[0].find("(plan/report)"), std::string::npos) << v[0];
  EXPECT_NE(v[1].find("src/base/status.cc:1: base includes"), std::string::npos)
      << v[1];
  EXPECT_NE(v[2].find("(backend/cpu)"), std::string::npos) << v[2];
  EXPECT_NE(v[3].find("belongs to no module"), std::string::npos) << v[3];
  EXPECT_NE(v[4].find("\"src/nowhere/c.h\", which belongs to no module"),
            std::string::npos)
      << v[4];
}

TEST(Layering, TableErrorsAreReported) {
  const Table cyclic = ParseTable(
      "<!-- layering-table -->\n| module | path | may include "
      "|\n|---|---|---|\n"
      "| a | `src/a` | b |\n| b | `src/b` | a |\n| c | `src/c` | nope |\n"
      "<!-- /layering-table -->\n");
  ASSERT_EQ(cyclic.errors.size(), 2u) << Join(cyclic.errors);
  EXPECT_NE(Join(cyclic.errors).find("unknown module 'nope'"),
            std::string::npos);
  EXPECT_NE(Join(cyclic.errors).find("cycle: a -> b -> a"), std::string::npos)
      << Join(cyclic.errors);
  EXPECT_FALSE(ParseTable("no table here").errors.empty());
}

}  // namespace
