# Loom: `make demo` (deps + build + the main job on the bundled model),
# `make build` (Release binary at build/loom), `make test` (build + ctest).
# `make asan`: the suite under ASan + UBSan (+ LeakSanitizer) in a clang build
# at build-asan; `make fuzz`: every libFuzzer harness for FUZZ_SECONDS each
# (docs/design/fuzzing.md). Both share build-asan.
JOBS ?= $(shell nproc)
BUILD_DIR ?= build
CMAKE_FLAGS ?=
ASAN_DIR ?= build-asan
FUZZ_SECONDS ?= 60
FUZZERS ?=
# Sanitizer runtime options of `make asan` (fatal on the first report; leaks
# checked at exit of every process, the `loom` runs of the CLI tests included).
SANITIZER_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

.PHONY: all build test demo deps bench clean asan fuzz format

all: build

deps:
	@bash scripts/install-deps.sh

# Configuring installs what is missing first (scripts/install-deps.sh is a
# no-op when every package is there), and a failed configure removes its
# cache, so the next `make` configures again instead of building a half-made
# tree.
$(BUILD_DIR)/CMakeCache.txt:
	@bash scripts/install-deps.sh
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null || \
	  { rm -f $(BUILD_DIR)/CMakeCache.txt; \
	    echo "cmake configure failed (see above); scripts/install-deps.sh installs the dependencies" >&2; exit 1; }

build: $(BUILD_DIR)/CMakeCache.txt
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

demo: deps build
	@bash scripts/demo.sh $(BUILD_DIR)/loom

bench: build
	@$(BUILD_DIR)/bench/loom_bench $(BENCH_ARGS)

# clang (libFuzzer), -O1 with line tables: symbolized reports, quick builds.
$(ASAN_DIR)/CMakeCache.txt:
	@bash scripts/install-deps.sh
	@CC=clang CXX=clang++ cmake -S . -B $(ASAN_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" -DLOOM_FUZZ=ON \
	  -DLOOM_CUDA=off -DLOOM_BUILD_BENCH=OFF $(CMAKE_FLAGS) >/dev/null || \
	  { rm -f $(ASAN_DIR)/CMakeCache.txt; \
	    echo "cmake configure (clang) failed (see above)" >&2; exit 1; }

asan: $(ASAN_DIR)/CMakeCache.txt
	@cmake --build $(ASAN_DIR) -j $(JOBS)
	@cd $(ASAN_DIR) && $(SANITIZER_ENV) ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

fuzz: $(ASAN_DIR)/CMakeCache.txt
	@cmake --build $(ASAN_DIR) --target loom_fuzzers -j $(JOBS)
	@bash fuzz/run.sh $(ASAN_DIR) $(FUZZ_SECONDS) $(FUZZERS)

format:
	@find src tools tests bench -name '*.cc' -o -name '*.h' | xargs clang-format -i

clean:
	@rm -rf $(BUILD_DIR) $(ASAN_DIR)
