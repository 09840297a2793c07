# ArkaTensor: the two commands a newcomer needs.
#   make run   set up, build, and serve the default model
#   make test  set up, build (normal + sanitizer builds), and run every test through ctest
# Everything else is an implementation detail of those two.

BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
MODEL      ?= ../shared/models/stories260K.gguf
PROMPT     ?= Once upon a time
CMAKE_ARGS ?=

.PHONY: run test setup build build-asan test-fast clean

run: setup build
	$(BUILD)/bin/arka generate -m $(MODEL) -p "$(PROMPT)" -n 200 --temp 0

test: setup build build-asan
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)
	ctest --test-dir $(ASAN_BUILD) --output-on-failure -j$(JOBS) -E '$(ASAN_SKIP)'

# Quicker loop while developing: normal build only.
test-fast: setup build
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)

setup:
	@bash scripts/setup.sh

build:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

# The sanitizer build skips CUDA (nvcc host code and ASan don't mix well and there is no GPU here).
build-asan:
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DARKA_SANITIZE=address,undefined -DARKA_CUDA=OFF $(CMAKE_ARGS) >/dev/null
	@cmake --build $(ASAN_BUILD) -j$(JOBS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
