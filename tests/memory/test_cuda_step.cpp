// The CUDA step replay (memory/cuda_step.h) against the GPU's own record: for every recorded
// run on the current code path (bench/gpu/2026-11-28-h100 and -h200, docs/memory.md "On CUDA")
// that the replay covers (every one since the fp32 path), every step's requests equal the trace's,
// size for size and free for free, and the caching allocator's model over them gives the step's
// measured allocated and reserved peaks (the bounds: allocated within 1%, reserved within
// 3%).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <sstream>
#include <unordered_map>

#include "core/config_io.h"
#include "core/gpu_catalog.h"
#include "memory/cuda_step.h"
#include "memory/parameter_tensors.h"
#include "memory/recorded_trace.h"
#include "spec/derived.h"
#include "spec/model_spec.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using namespace vlm;

namespace {

// The recordings on the current code path, each with the micro-batch shapes of its traces
// (scripts/trace_shapes.py): the recording matrix on an H100, and on an H200 the rest of the
// matrix and a run of `batch_size: auto` on an 80 GB budget (several rows per micro-batch, the
// preflight before it, the allocator at its cap). Every run listed must be replayed: a new
// recording joins the list with the replay that covers it.
const std::vector<fs::path> kRecorded = {fs::path(VLM_SOURCE_DIR) / "bench/gpu/2026-11-28-h100",
                                         fs::path(VLM_SOURCE_DIR) / "bench/gpu/2026-11-28-h200"};

// A step's allocations in order: bytes, and how many allocations of the step preceded its free
// (-1: not freed within the step), the form in which two streams can be compared.
struct Lifetimes {
  std::vector<int64_t> bytes;
  std::vector<int64_t> freed_after;
};

Lifetimes recorded_lifetimes(const memory::RecordedStep& step) {
  Lifetimes out;
  std::unordered_map<uint64_t, size_t> live;  // address -> allocation index within the step
  for (const auto& e : step.events) {
    if (e.kind == 'A') {
      live[e.address] = out.bytes.size();
      out.bytes.push_back(e.bytes);
      out.freed_after.push_back(-1);
    } else if (e.kind == 'F') {
      const auto it = live.find(e.address);
      if (it == live.end()) continue;  // allocated before the step
      out.freed_after[it->second] = static_cast<int64_t>(out.bytes.size());
      live.erase(it);
    }
  }
  return out;
}

Lifetimes generated_lifetimes(const std::vector<memory::cuda::Request>& requests, size_t from,
                              size_t to) {
  Lifetimes out;
  std::unordered_map<int32_t, size_t> live;
  for (size_t i = from; i < to; ++i) {
    const auto& r = requests[i];
    if (r.bytes > 0) {
      live[r.id] = out.bytes.size();
      out.bytes.push_back(r.bytes);
      out.freed_after.push_back(-1);
    } else if (const auto it = live.find(r.id); it != live.end()) {
      out.freed_after[it->second] = static_cast<int64_t>(out.bytes.size());
      live.erase(it);
    }
  }
  return out;
}

// A recorded micro-batch (scripts/trace_shapes.py): its tokens, segments, supervised tokens and
// crops; for fp32 also its rows and segment lengths (from the planner).
memory::cuda::MicroBatchShape micro_of(const nlohmann::json& m) {
  memory::cuda::MicroBatchShape s;
  s.tokens = m.at("tokens").get<int64_t>();
  s.segments = m.at("segments").is_null() ? 0 : m.at("segments").get<int64_t>();
  s.supervised = m.at("supervised").get<int64_t>();
  s.crops = m.at("crops").get<int64_t>();
  if (m.contains("segment_lengths")) {
    s.rows = m.at("rows").get<int64_t>();
    s.segment_lengths = m.at("segment_lengths").get<std::vector<int64_t>>();
  }
  return s;
}

Config run_config(const nlohmann::json& run) {
  const std::vector<std::string> overrides = run.at("overrides").get<std::vector<std::string>>();
  bool tiny = false;
  for (const auto& o : overrides) tiny = tiny || o == "model.preset=tiny";
  const std::string base = tiny ? "/configs/demo.yaml" : "/configs/nanovlm.yaml";
  return load_config(VLM_SOURCE_DIR + base, overrides).config;
}

}  // namespace

TEST_CASE("cuda step replay: every recorded step's requests and peaks, on the recorded GPU",
          "[cuda_step]") {
  int replayed = 0;
  for (const fs::path& recorded_in : kRecorded) {
    const auto runs = nlohmann::json::parse(test::read_file(recorded_in / "micro_batches.json"));
    for (const auto& [name, run] : runs.items()) {
      const Config config = run_config(run);
      const memory::MemorySpec spec = memory::run_spec(config, /*cuda=*/true);
      const std::string why = memory::cuda::unmodelled(spec);
      INFO(name << (why.empty() ? "" : ": " + why));
      CHECK(why.empty());  // every recorded run on the current code path is replayed
      if (!why.empty()) continue;
      const fs::path folder = recorded_in / fs::path(name).parent_path();
      std::istringstream text(
          test::read_xz_file(folder / (fs::path(name).filename().string() + ".trace.xz")));
      const memory::RecordedTrace trace = memory::read_memory_trace(text);
      // A capped allocator (memory.simulate_device_bytes) returned cached segments at its cap.
      const int64_t cap = memory::recorded_capacity(trace);
      REQUIRE(trace.steps.size() == run.at("steps").size());

      memory::cuda::StepStream stream(spec, memory::cuda::GpuShape{});
      stream.model_states();
      // The model states are what the allocator held when the recording began.
      const memory::cuda::StreamPeaks states =
          memory::cuda::replay_peaks(stream.requests(), 0, stream.requests().size());
      // The preflight's forward and backward ran before the recording began: gradients exist.
      // Its micro-batch is not in the trace; the first step's stands in for it (what the first
      // step's requests depend on is which gradients and workspaces exist, not their shapes).
      if (config.train.preflight) {
        stream.backward_passes({micro_of(run.at("steps")[0].at("micro_batches")[0])});
      } else {
        CHECK(states.allocated == trace.steps.front().allocated_at_start);
      }
      for (size_t k = 0; k < trace.steps.size(); ++k) {
        const memory::RecordedStep& recorded = trace.steps[k];
        std::vector<memory::cuda::MicroBatchShape> micro;
        for (const auto& m : run.at("steps")[k].at("micro_batches")) micro.push_back(micro_of(m));
        const size_t from = stream.requests().size();
        stream.step(micro);
        const size_t to = stream.requests().size();
        INFO("step " << recorded.step);
        const Lifetimes want = recorded_lifetimes(recorded);
        const Lifetimes got = generated_lifetimes(stream.requests(), from, to);
        // Where the two part, for the reader of a failure: the request's index and op stack.
        size_t part = 0;
        while (part < got.bytes.size() && part < want.bytes.size() &&
               got.bytes[part] == want.bytes[part] &&
               got.freed_after[part] == want.freed_after[part]) {
          ++part;
        }
        // Sizes first: a request missing or extra shows there before in the lifetimes.
        size_t sized = 0;
        while (sized < got.bytes.size() && sized < want.bytes.size() &&
               got.bytes[sized] == want.bytes[sized]) {
          ++sized;
        }
        if (sized < got.bytes.size() || sized < want.bytes.size()) part = sized;
        if (part < want.bytes.size() || part < got.bytes.size()) {
          size_t seen = 0;
          int32_t context = -1;
          for (const auto& e : recorded.events) {
            if (e.kind == 'A' && seen++ == part) {
              context = e.context;
              break;
            }
          }
          UNSCOPED_INFO("request "
                        << part << " differs: replay "
                        << (part < got.bytes.size() ? got.bytes[part] : -1) << " B freed after "
                        << (part < got.freed_after.size() ? got.freed_after[part] : -2) << ", GPU "
                        << (part < want.bytes.size() ? want.bytes[part] : -1) << " B freed after "
                        << (part < want.freed_after.size() ? want.freed_after[part] : -2) << " ("
                        << (context >= 0 ? trace.contexts[static_cast<size_t>(context)] : "")
                        << ")");
        }
        CHECK(got.bytes == want.bytes);
        CHECK(got.freed_after == want.freed_after);
        const memory::cuda::StreamPeaks peaks =
            memory::cuda::replay_peaks(stream.requests(), from, to, cap);
        INFO("allocated " << peaks.allocated << " against " << recorded.peak_allocated
                          << ", reserved " << peaks.reserved << " against "
                          << recorded.peak_reserved);
        CHECK(std::abs(peaks.allocated - recorded.peak_allocated) <= recorded.peak_allocated / 100);
        // Reserved holds the process's history: the preflight's, when it ran, is not in the trace
        // (its micro-batch stands in above), so the cache it left differs; the cap bounds it.
        if (config.train.preflight) {
          CHECK(peaks.reserved <= cap);
        } else {
          CHECK(std::abs(peaks.reserved - recorded.peak_reserved) <=
                3 * recorded.peak_reserved / 100);
        }
        ++replayed;
        // As a prediction makes it, knowing the step alone: a process that reached the state
        // (model states, then a step of the same micro-batches), then the step.
        std::vector<memory::BatchShape> shapes;
        for (const auto& m : micro) {
          memory::BatchShape b;
          b.rows = m.rows;
          b.row_tokens = m.tokens / m.rows;
          b.segments = m.segments;
          b.segment_lengths = m.segment_lengths;
          b.supervised_tokens = m.supervised;
          b.crops = m.crops;
          shapes.push_back(b);
        }
        const memory::StepState state{k > 0, k > 0};
        memory::DeviceTarget h100 =
            memory::DeviceTarget::cuda_device(*find_gpu("H100-80GB"), {2, 11}, 1);
        // The device the run had: an H100's 80 GB, or the memory it simulated.
        if (const int64_t simulated = config.memory.simulate_device_bytes.bytes; simulated > 0) {
          h100.device_bytes = simulated;
        }
        const auto predicted = memory::cuda::replayed_step(spec, shapes, state, h100, {});
        REQUIRE(predicted.has_value());
        INFO("predicted alone: allocated " << predicted->allocated << ", reserved "
                                           << predicted->reserved);
        CHECK(std::abs(predicted->allocated - recorded.peak_allocated) <=
              recorded.peak_allocated / 100);
        // Reserved segments outlive the steps that took them (the allocator keeps its cache): a
        // run's reserved peak holds its history, which a prediction of the step alone does not
        // know, so it is bounded from above only (the allocator frees cached segments before it
        // fails a request: what must fit is the step's own).
        CHECK(predicted->reserved <= recorded.peak_reserved + 3 * recorded.peak_reserved / 100);
        // VLM_CUDA_STEP_TABLE=1 prints docs/memory.md's two accuracy tables' rows: in sequence
        // ("seq"), and knowing the step alone ("alone").
        if (std::getenv("VLM_CUDA_STEP_TABLE")) {
          const auto pct = [](int64_t got, int64_t want) {
            return 100.0 * static_cast<double>(got - want) / static_cast<double>(want);
          };
          std::printf(
              "seq | %s | %d | %lld / %lld | %+.3f%% | %lld / %lld | %+.3f%% |\n", name.c_str(),
              static_cast<int>(recorded.step), static_cast<long long>(peaks.allocated),
              static_cast<long long>(recorded.peak_allocated),
              pct(peaks.allocated, recorded.peak_allocated), static_cast<long long>(peaks.reserved),
              static_cast<long long>(recorded.peak_reserved),
              pct(peaks.reserved, recorded.peak_reserved));
          std::printf("alone | %s | %d | %lld | %+.3f%% | %lld / %lld | %+.2f%% |\n", name.c_str(),
                      static_cast<int>(recorded.step), static_cast<long long>(predicted->allocated),
                      pct(predicted->allocated, recorded.peak_allocated),
                      static_cast<long long>(predicted->reserved),
                      static_cast<long long>(recorded.peak_reserved),
                      pct(predicted->reserved, recorded.peak_reserved));
        }
      }
    }
  }
  CHECK(replayed >= 56);  // the walk found the recorded runs: 56 steps of 22
}

namespace {

// The requests a stream leaves allocated at its end: how many, and their bytes.
std::pair<size_t, int64_t> live_at_end(const std::vector<memory::cuda::Request>& requests) {
  std::unordered_map<int32_t, int64_t> live;
  for (const auto& r : requests) {
    if (r.bytes > 0) {
      live[r.id] = r.bytes;
    } else {
      live.erase(r.id);
    }
  }
  int64_t total = 0;
  for (const auto& [id, bytes] : live) total += bytes;
  return {live.size(), total};
}

}  // namespace

TEST_CASE(
    "cuda step replay of an untied head, from the code (no trace has one yet): the head's "
    "weight, its gradient kept from the first step and AdamW's moments are what the tied model "
    "lacks",
    "[cuda_step]") {
  for (const char* precision : {"bf16", "fp32"}) {
    for (const char* chunk : {"0", "16"}) {
      if (std::string(precision) == "fp32" && std::string(chunk) != "0") continue;
      INFO(precision << ", loss chunks of " << chunk);
      const auto after_a_step = [&](bool tied) {
        const Config config =
            load_config(VLM_SOURCE_DIR "/configs/demo.yaml",
                        {std::string("train.precision=") + precision,
                         std::string("model.loss_chunk_tokens=") + chunk,
                         std::string("model.language.tie_embeddings=") + (tied ? "true" : "false")})
                .config;
        memory::cuda::StepStream stream(memory::run_spec(config, true), {});
        stream.model_states();
        memory::cuda::MicroBatchShape m{512, 3, 40, 4};
        m.segment_lengths = {200, 200, 112};
        // 4,096 tokens take the embedding's sort path (above 3,072 indices).
        memory::cuda::MicroBatchShape big{4096, 8, 300, 6, 8, std::vector<int64_t>(8, 512)};
        stream.step({m, big});  // two micro-steps: the second adds into the kept gradients
        return live_at_end(stream.requests()).second;
      };
      const Config tiny = load_config(VLM_SOURCE_DIR "/configs/demo.yaml").config;
      const spec::ModelSpec dims = tiny.model.dims;
      const int64_t head = 4 * spec::language_vocab_rows(dims.language) * dims.language.hidden_size;
      CHECK(after_a_step(false) - after_a_step(true) == 4 * head);
    }
  }
}

TEST_CASE("cuda step replay in fp32 stops at heads of more than 64 dimensions", "[cuda_step]") {
  spec::ModelSpec dims = spec::preset("tiny");
  const auto why = [&] {
    return memory::cuda::unmodelled(
        memory::memory_spec(dims, ModelLevers{}, memory::ComputePrecision::kFp32));
  };
  CHECK(why().empty());
  dims.language.num_heads = 1;  // one head of the whole width
  dims.language.num_kv_heads = 1;
  REQUIRE(spec::language_head_dim(dims.language) > 64);
  CHECK(why().find("64 dimensions") != std::string::npos);
  // bf16 runs FlashAttention, whose buffers follow any head dimension.
  CHECK(memory::cuda::unmodelled(
            memory::memory_spec(dims, ModelLevers{}, memory::ComputePrecision::kBf16))
            .empty());
}

TEST_CASE(
    "cuda step replay over two ranks: the communicator's buffers before the model, the "
    "gradients flattened into buckets before the optimizer",
    "[cuda_step]") {
  const Config config =
      load_config(VLM_SOURCE_DIR "/configs/demo.yaml", {"train.precision=bf16"}).config;
  const auto requests_of = [&](int64_t ranks) {
    memory::cuda::StepStream stream(memory::run_spec(config, true, ranks), {});
    stream.model_states();
    const size_t states = stream.requests().size();
    stream.step({{512, 3, 40, 4}});
    return std::make_pair(states, stream.requests());
  };
  const auto [states1, one] = requests_of(1);
  const auto [states2, two] = requests_of(2);
  REQUIRE(states2 == states1 + 2);
  CHECK(two[0].bytes == 4);       // the OOM agreement's flag
  CHECK(two[1].bytes == 8 * 64);  // the metrics' doubles
  // The tiny model's gradients fit one 25 MiB bucket: one flattening of all of them, the only
  // request the second rank adds to the step.
  std::vector<int64_t> a, b;
  for (size_t i = states1; i < one.size(); ++i) a.push_back(one[i].bytes);
  for (size_t i = states2; i < two.size(); ++i) b.push_back(two[i].bytes);
  REQUIRE(b.size() == a.size() + 2);  // the bucket and its free
  int64_t gradient_bytes = 0;
  for (const auto& t : memory::parameter_tensors(memory::run_spec(config, true, 2))) {
    if (t.trainable) gradient_bytes += 4 * t.elements;
  }
  CHECK(std::find(b.begin(), b.end(), gradient_bytes) != b.end());
  CHECK(std::find(a.begin(), a.end(), gradient_bytes) == a.end());
}

TEST_CASE(
    "cuda step replay over random configurations: every free is of a live request, a step "
    "leaves the process's state as it found it, and a step's peak is above that state",
    "[cuda_step]") {
  std::mt19937 rng(11);
  const auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  int covered = 0;
  // A micro-batch of 1-3 rows, each cut into 1-3 segments (fp32's grouped attention reads them).
  const auto micro_batch = [&](int64_t crops) {
    memory::cuda::MicroBatchShape m;
    m.rows = pick(1, 3);
    const int64_t row = 8 * pick(4, 32);
    for (int64_t r = 0; r < m.rows; ++r) {
      int64_t left = row;
      for (int64_t cut = pick(0, 2); cut > 0 && left > 8; --cut) {
        const int64_t len = pick(1, left - 1);
        m.segment_lengths.push_back(len);
        left -= len;
      }
      m.segment_lengths.push_back(left);
    }
    m.tokens = m.rows * row;
    m.segments = static_cast<int64_t>(m.segment_lengths.size());
    m.supervised = pick(1, m.tokens / 2);
    m.crops = crops;
    return m;
  };
  for (int trial = 0; trial < 160; ++trial) {
    ModelLevers levers;
    levers.checkpoint_vision = pick(0, 2) == 0;
    levers.checkpoint_language = pick(0, 2) == 0;
    levers.freeze_vision = pick(0, 3) == 0;
    levers.freeze_language = pick(0, 3) == 0;
    levers.frozen_dtype = pick(0, 1) ? "bf16" : "fp32";
    levers.vision_chunk_crops = pick(0, 1) ? pick(1, 5) : 0;
    levers.loss_chunk_tokens = pick(0, 2) == 0 ? pick(4, 32) : 0;
    const bool fp32 = pick(0, 2) == 0;
    spec::ModelSpec dims = spec::preset("tiny");
    dims.language.tie_embeddings = pick(0, 3) != 0;
    memory::MemorySpec spec = memory::memory_spec(
        dims, levers, fp32 ? memory::ComputePrecision::kFp32 : memory::ComputePrecision::kBf16);
    spec.ranks = pick(1, 2);
    INFO("trial " << trial << ": " << (fp32 ? "fp32" : "bf16") << ", checkpoint "
                  << levers.checkpoint_vision << levers.checkpoint_language << ", frozen ViT "
                  << levers.freeze_vision << ", frozen decoder " << levers.freeze_language << " ("
                  << levers.frozen_dtype << "), ViT chunks " << levers.vision_chunk_crops
                  << ", loss chunks " << levers.loss_chunk_tokens << ", tied "
                  << dims.language.tie_embeddings << ", ranks " << spec.ranks);
    if (!memory::cuda::unmodelled(spec).empty()) continue;
    ++covered;
    std::vector<memory::cuda::MicroBatchShape> step;
    const int64_t micro = pick(1, 3);
    for (int64_t k = 0; k < micro; ++k) {
      // With the decoder frozen a text-only micro-batch runs no backward (not walked).
      const int64_t crops = levers.freeze_language || pick(0, 1) ? pick(1, 9) : 0;
      step.push_back(micro_batch(crops));
    }
    memory::cuda::StepStream stream(spec, {});
    stream.model_states();
    const auto live_after = [&] { return live_at_end(stream.requests()); };
    // A text-only micro-batch first at times: the image path's gradients come a step later.
    if (!levers.freeze_language && pick(0, 2) == 0) stream.step({micro_batch(0)});
    REQUIRE_NOTHROW(stream.step(step));  // a free of a request not live throws
    const auto after_first = live_after();
    const size_t from = stream.requests().size();
    REQUIRE_NOTHROW(stream.step(step));
    const auto after_second = live_after();
    // The second step of the same micro-batches leaves what the first left: the model states,
    // gradients, moments, cuBLAS's workspaces and the cached cu_seqlens.
    CHECK(after_second == after_first);
    const memory::cuda::StreamPeaks peaks =
        memory::cuda::replay_peaks(stream.requests(), from, stream.requests().size());
    CHECK(peaks.allocated > peaks.allocated_before);
    CHECK(peaks.reserved >= peaks.allocated);
  }
  CHECK(covered >= 60);
}

TEST_CASE(
    "cuda step replay: a micro-batch beyond the model's range is not replayed, not "
    "overflowed",
    "[cuda_step]") {
  const memory::MemorySpec spec = memory::memory_spec(spec::preset("nanovlm-460m"), ModelLevers{},
                                                      memory::ComputePrecision::kBf16);
  const memory::DeviceTarget h100 =
      memory::DeviceTarget::cuda_device(*find_gpu("H100-80GB"), {2, 11}, 1);
  memory::BatchShape huge;
  huge.rows = 65536;
  huge.row_tokens = int64_t{1} << 20;
  huge.segments = 1;
  huge.supervised_tokens = 1;
  huge.crops = int64_t{1} << 40;
  CHECK_FALSE(memory::cuda::replayed_step(spec, {huge}, {true, true}, h100, {}).has_value());
  memory::BatchShape fine = huge;
  fine.rows = 1;
  fine.row_tokens = 4096;
  fine.crops = 8;
  CHECK(memory::cuda::replayed_step(spec, {fine}, {true, true}, h100, {}).has_value());
}
