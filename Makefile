# Thin wrapper: the two set-up commands of README.md. Everything real lives in CMake.
#   make demo   install deps, build the lockstep target (Release), run the aa-demo campaign (the main job), print
#               both times and the report path
#   make test   install deps and the llama.cpp component (scripts/install-llamacpp.sh, non-fatal: without it
#               the llama.cpp tests skip), build, run the whole test suite (what CI runs, after format-check)
#   make format / make format-check   apply .clang-format to product and test code / fail on a diff
BUILD ?= build
JOBS ?= $(shell nproc)
LOCKSTEP := $(BUILD)/harness/lockstep
CMAKE_FLAGS ?=
ifeq ($(CI),true)
CMAKE_FLAGS += -DLOCKSTEP_WERROR=ON
endif

.PHONY: deps llamacpp build demo test test-under-load test-clang-dtype test-fuzz bench clean format format-check

deps:
	@scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS)

# The demo needs the `lockstep` executable alone: only that target is built (`make test` builds
# everything), and the build and the campaign are timed.
demo: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	@t0=$$(date +%s) && cmake --build $(BUILD) -j$(JOBS) --target lockstep && \
	  echo "demo: built the lockstep target in $$(( $$(date +%s) - t0 )) s"
	@rm -rf out/demo/aa-demo
	@t0=$$(date +%s) && $(LOCKSTEP) run campaigns/aa-demo.toml --out out/demo/aa-demo && \
	  echo "demo: the aa-demo campaign ran in $$(( $$(date +%s) - t0 )) s"
	@echo
	@echo "demo report: out/demo/aa-demo/report.md (also report.html, junit.xml; ledger.jsonl is the record)"

# The optional llama.cpp component (issue 38): two pinned npm tarballs, checksummed, into
# .cache/llamacpp. Only `make test` fetches; a failed fetch leaves the build without the adapter.
llamacpp: deps
	@scripts/install-llamacpp.sh || echo "llama.cpp component not installed: its tests will skip"

test: llamacpp
	@$(MAKE) --no-print-directory build
	@$(MAKE) --no-print-directory test-clang-dtype
	@$(MAKE) --no-print-directory test-fuzz
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 600

# The e2e suites beside a CPU hog (one busy process per core), RUNS times in a row (default 3):
# every run must pass with no retry (scripts/test-under-load.sh). Not part of `make test`.
test-under-load: build
	@BUILD=$(BUILD) JOBS=$(JOBS) scripts/test-under-load.sh

# The dtype conversions must be right under g++ and clang (g++ 12.2 miscompiles a masked bf16
# truncation at -O1+): the same tests, built with clang++ -O2, when clang++ is installed.
CLANG_DTYPE_BIN := $(BUILD)/dtype_test_clang
test-clang-dtype:
	@if command -v clang++ >/dev/null 2>&1; then \
	  clang++ -std=c++20 -O2 -march=native -ffp-contract=off -Iengine/include -Itests -Iengine \
	    engine/util/status.cpp engine/util/dtype.cpp tests/engine/dtype_test.cpp \
	    -lgtest -lgtest_main -pthread -o $(CLANG_DTYPE_BIN) && $(CLANG_DTYPE_BIN) --gtest_brief=1; \
	else echo "clang++ not installed: dtype tests ran under g++ only"; fi

# The libFuzzer targets need clang: built here with -fsanitize=fuzzer,address,undefined over the
# sources they exercise, and run for a bounded number of inputs (seconds) when clang++ is installed.
FUZZ_BIN := $(BUILD)/fuzz-bin
FUZZ_FLAGS := -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iengine/include -Iengine -Icompare/include
test-fuzz:
	@if command -v clang++ >/dev/null 2>&1; then \
	  mkdir -p $(FUZZ_BIN) && \
	  clang++ $(FUZZ_FLAGS) tests/fuzz/trace_fuzz.cpp compare/align.cpp engine/observe/window.cpp engine/util/status.cpp engine/util/median.cpp \
	    engine/util/atomic_file.cpp -lfmt -o $(FUZZ_BIN)/trace_fuzz && \
	  rm -rf $(FUZZ_BIN)/corpus && cp -r tests/fuzz/corpus/trace $(FUZZ_BIN)/corpus && \
	  { $(FUZZ_BIN)/trace_fuzz -runs=10000 -seed=1 -max_len=4096 $(FUZZ_BIN)/corpus >$(FUZZ_BIN)/trace_fuzz.log 2>&1 \
	    && tail -1 $(FUZZ_BIN)/trace_fuzz.log || { tail -40 $(FUZZ_BIN)/trace_fuzz.log; exit 1; }; } && \
	  clang++ $(FUZZ_FLAGS) -DLOCKSTEP_TINY_TOKENIZER='"$(CURDIR)/tests/tokenizer/data/tiny_tokenizer.json"' \
	    tests/fuzz/tokenizer_fuzz.cpp engine/model/tokenizer.cpp engine/model/utf8.cpp engine/model/pretokenize.cpp \
	    engine/model/bpe_config.cpp engine/model/bpe_tokenizer.cpp engine/model/bpe_gguf.cpp engine/model/gguf_file.cpp engine/model/weight_types.cpp \
	    engine/util/status.cpp engine/util/atomic_file.cpp -licuuc -lfmt -o $(FUZZ_BIN)/tokenizer_fuzz && \
	  rm -rf $(FUZZ_BIN)/tokenizer-corpus && cp -r tests/fuzz/corpus/tokenizer $(FUZZ_BIN)/tokenizer-corpus && \
	  { $(FUZZ_BIN)/tokenizer_fuzz -runs=30000 -seed=1 -max_len=512 $(FUZZ_BIN)/tokenizer-corpus \
	      >$(FUZZ_BIN)/tokenizer_fuzz.log 2>&1 && tail -1 $(FUZZ_BIN)/tokenizer_fuzz.log || { tail -40 $(FUZZ_BIN)/tokenizer_fuzz.log; exit 1; }; } && \
	  clang++ $(FUZZ_FLAGS) tests/fuzz/gguf_fuzz.cpp engine/model/gguf_file.cpp engine/model/weight_types.cpp engine/util/status.cpp \
	    engine/util/atomic_file.cpp engine/model/bpe_gguf.cpp engine/model/bpe_config.cpp engine/model/bpe_tokenizer.cpp \
	    engine/model/tokenizer.cpp engine/model/utf8.cpp engine/model/pretokenize.cpp -licuuc -lfmt -o $(FUZZ_BIN)/gguf_fuzz && \
	  rm -rf $(FUZZ_BIN)/gguf_corpus && cp -r tests/fuzz/corpus/gguf $(FUZZ_BIN)/gguf_corpus && \
	  { $(FUZZ_BIN)/gguf_fuzz -runs=20000 -seed=1 -max_len=8192 $(FUZZ_BIN)/gguf_corpus >$(FUZZ_BIN)/gguf_fuzz.log 2>&1 \
	    && tail -1 $(FUZZ_BIN)/gguf_fuzz.log || { tail -40 $(FUZZ_BIN)/gguf_fuzz.log; exit 1; }; } && \
	  clang++ $(FUZZ_FLAGS) -Iharness tests/fuzz/serve_request_fuzz.cpp harness/serve/completion_request.cpp harness/serve/json_body.cpp \
	    harness/serve/api_error.cpp -o $(FUZZ_BIN)/serve_request_fuzz && \
	  rm -rf $(FUZZ_BIN)/serve_corpus && cp -r tests/fuzz/corpus/serve_request $(FUZZ_BIN)/serve_corpus && \
	  { $(FUZZ_BIN)/serve_request_fuzz -runs=10000 -seed=1 -max_len=4096 $(FUZZ_BIN)/serve_corpus >$(FUZZ_BIN)/serve_request_fuzz.log 2>&1 \
	    && tail -1 $(FUZZ_BIN)/serve_request_fuzz.log || { tail -40 $(FUZZ_BIN)/serve_request_fuzz.log; exit 1; }; }; \
	else echo "clang++ not installed: fuzz targets not run"; fi

# Every C++ and CUDA source git tracks (product and tests) is formatted by .clang-format, with the
# clang-format that scripts/install-deps.sh installs (Debian 12's, 14): another version may format
# differently, so the check names the version it ran.
FORMAT_FILES = $(shell git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
format: deps
	@test -n "$(FORMAT_FILES)" || { echo "format: no sources found (not a git checkout?)"; exit 1; }
	@clang-format -i $(FORMAT_FILES)
format-check: deps
	@test -n "$(FORMAT_FILES)" || { echo "format-check: no sources found (not a git checkout?)"; exit 1; }
	@bad=$$(clang-format --dry-run --Werror $(FORMAT_FILES) 2>&1 | grep -- '-Wclang-format-violations' | cut -d: -f1 | sort -u); \
	  if [ -n "$$bad" ]; then echo "$$bad" | sed 's/^/  differs: /'; \
	    echo "format-check: $$(echo "$$bad" | wc -l) files differ from .clang-format (run 'make format'; $$(clang-format --version))"; exit 1; \
	  fi; echo "format-check: $(words $(FORMAT_FILES)) files match .clang-format ($$(clang-format --version))"

bench: build
	$(BUILD)/tests/bench/engine_bench --benchmark_counters_tabular=true

clean:
	rm -rf $(BUILD) out
