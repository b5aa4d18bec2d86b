# Loom: `make demo` (deps + build + the main job on the bundled model),
# `make build` (Release binary at build/loom), `make test` (build + ctest).
JOBS ?= $(shell nproc)
BUILD_DIR ?= build
CMAKE_FLAGS ?=

.PHONY: all build test demo deps bench clean asan format

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD_DIR)/CMakeCache.txt:
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null || \
	  { echo "cmake configure failed: run 'make deps' (scripts/install-deps.sh) first" >&2; exit 1; }

build: $(BUILD_DIR)/CMakeCache.txt
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

demo: deps build
	@bash scripts/demo.sh $(BUILD_DIR)/loom

bench: build
	@$(BUILD_DIR)/bench/loom_bench $(BENCH_ARGS)

asan:
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_SANITIZE=ON >/dev/null
	@cmake --build build-asan -j $(JOBS)
	@cd build-asan && ctest --output-on-failure -j $(JOBS)

format:
	@find src tools tests bench -name '*.cc' -o -name '*.h' | xargs clang-format -i

clean:
	@rm -rf $(BUILD_DIR) build-asan
