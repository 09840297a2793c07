# ArkaTensor: the two commands a newcomer needs.
#   make run   set up, build, and serve the default model (OpenAI-compatible API on :8080)
#   make test  set up, build (normal + sanitizer builds), and run every test through ctest
# Everything else is an implementation detail of those two.

BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
JOBS       ?= $(shell nproc)
MODEL      ?= ../shared/models/stories260K.gguf
# Where the default model comes from when $(MODEL) is absent (llama2.c's stories260K as ggml-org
# publishes it), and the checksum it must have.
MODEL_URL  ?= https://huggingface.co/ggml-org/models/resolve/main/tinyllamas/stories260K.gguf
MODEL_SHA  ?= 270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d
CACHE_DIR  ?= $(or $(ARKA_CACHE_DIR),$(HOME)/.cache/arka)
PORT       ?= 8080
# stories260K ships no chat template: chatml lets /v1/chat/completions work on it. For a model
# with its own template, run with SERVE_ARGS= (or other `arka serve` flags).
SERVE_ARGS ?= --chat-template chatml
CMAKE_ARGS ?=

.PHONY: run run-model test setup build build-asan build-fuzz test-fast test-docker clean

run: run-model setup build
	@m="$(MODEL)"; \
	if [ ! -e "$$m" ]; then \
	  m="$(CACHE_DIR)/models/$$(basename "$(MODEL_URL)")"; \
	  [ -f "$$m" ] || $(BUILD)/bin/arka pull "$(MODEL_URL)" -o "$(CACHE_DIR)/models" --sha256 $(MODEL_SHA) || exit 1; \
	fi; \
	exec $(BUILD)/bin/arka serve -m "$$m" --port $(PORT) $(SERVE_ARGS)

test: setup build build-asan build-fuzz
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)
	ctest --test-dir $(ASAN_BUILD) --output-on-failure -j$(JOBS) -E '$(ASAN_SKIP)'
	ctest --test-dir $(FUZZ_BUILD) --output-on-failure -j$(JOBS) -R '^fuzz_'
	@if [ "$${ARKA_DOCKER_TESTS:-0}" = 1 ]; then bash tests/docker/run.sh; fi

# Quicker loop while developing: normal build only.
test-fast: setup build
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)

# The containers built and run for real (root; installs and starts the Docker engine when absent;
# docker/README.md). Opt-in: not part of `make test` unless ARKA_DOCKER_TESTS=1.
test-docker:
	bash tests/docker/run.sh

# A MODEL given on the command line or in the environment must exist (checked before anything is
# installed or built); only the default one is downloaded when absent.
run-model:
	@if [ "$(origin MODEL)" != file ] && [ ! -e "$(MODEL)" ]; then \
	  echo "make run: MODEL=$(MODEL): no such file or directory (give a GGUF file or a Hugging Face directory)" >&2; exit 1; \
	fi

setup:
	@bash scripts/setup.sh

build:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

# The sanitizer build skips CUDA (nvcc host code and ASan don't mix well and there is no GPU here).
build-asan:
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DARKA_SANITIZE=address,undefined -DARKA_CUDA=OFF $(CMAKE_ARGS) >/dev/null
	@cmake --build $(ASAN_BUILD) -j$(JOBS)

# libFuzzer targets (clang, everything instrumented): `make test` runs each for 30 s
# (ARKA_LONG_TESTS=1: 300 s; tests/fuzz/README.md).
build-fuzz:
	@cmake -S . -B $(FUZZ_BUILD) -DARKA_FUZZ=ON -DCMAKE_C_COMPILER=clang -DARKA_CUDA=OFF -DCMAKE_BUILD_TYPE=Release \
	  -DCMAKE_C_FLAGS_RELEASE="-O1 -g" $(CMAKE_ARGS) >/dev/null
	@cmake --build $(FUZZ_BUILD) -j$(JOBS) --target fuzz

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
