#include "runtime/profiler.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/error.h"
#include "runtime/compat.h"

#if VLM_KINETO_PROFILER
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

namespace vlm::runtime {

bool profiler_available() { return VLM_KINETO_PROFILER != 0; }

#if VLM_KINETO_PROFILER

namespace {

namespace kp = torch::autograd::profiler;
namespace pi = torch::profiler::impl;

// libkineto::ActivityType (kineto/ActivityType.h), as KinetoEvent::activityType() reports it.
enum : uint8_t { kCpuOp = 0, kUserAnnotation = 1, kMemcpy = 3, kMemset = 4, kKernel = 5 };

struct Interval {
  uint64_t start, end;
};

double ms(uint64_t ns) { return static_cast<double>(ns) / 1e6; }

// The time covered by the union of the intervals (device work that overlaps counts once).
uint64_t covered_ns(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(),
            [](const Interval& a, const Interval& b) { return a.start < b.start; });
  uint64_t total = 0, start = 0, end = 0;
  bool open = false;
  for (const Interval& i : v) {
    if (!open || i.start > end) {
      if (open) total += end - start;
      start = i.start;
      end = i.end;
      open = true;
    } else {
      end = std::max(end, i.end);
    }
  }
  if (open) total += end - start;
  return total;
}

struct Totals {
  int64_t count = 0;
  uint64_t ns = 0;
};

nlohmann::json top(const std::map<std::string, Totals>& by_name, size_t n, uint64_t whole_ns,
                   size_t steps) {
  std::vector<std::pair<std::string, Totals>> v(by_name.begin(), by_name.end());
  std::sort(v.begin(), v.end(),
            [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < v.size() && i < n; ++i) {
    out.push_back(
        {{"name", v[i].first},
         {"count", v[i].second.count},
         {"total_ms", ms(v[i].second.ns)},
         {"ms_per_step", ms(v[i].second.ns) / static_cast<double>(std::max<size_t>(steps, 1))},
         {"share", whole_ns > 0
                       ? static_cast<double>(v[i].second.ns) / static_cast<double>(whole_ns)
                       : 0.0}});
  }
  return out;
}

// The summary of docs/profiling.md from the profiler's events.
nlohmann::json summarise(const std::vector<kp::KinetoEvent>& events) {
  std::vector<Interval> steps;
  std::map<std::string, Totals> phases, kernels, host_ops;
  std::vector<std::pair<Interval, uint8_t>> device;  // kernels, copies, memsets
  for (const kp::KinetoEvent& e : events) {
    const uint8_t type = e.activityType();
    const Interval at{e.startNs(), std::max(e.endNs(), e.startNs())};
    if (type == kKernel || type == kMemcpy || type == kMemset) {
      device.push_back({at, type});
      if (type == kKernel) {
        Totals& t = kernels[e.name()];
        ++t.count;
        t.ns += at.end - at.start;
      }
      continue;
    }
    if (type != kCpuOp && type != kUserAnnotation) continue;
    const std::string name = e.name();
    if (name == "vlm::step") {
      steps.push_back(at);
    } else if (name.rfind("vlm::", 0) == 0) {
      Totals& t = phases[name];
      ++t.count;
      t.ns += at.end - at.start;
    } else if (name.rfind("aten::", 0) == 0) {
      Totals& t = host_ops[name];
      ++t.count;
      t.ns += at.end - at.start;
    }
  }
  std::sort(steps.begin(), steps.end(),
            [](const Interval& a, const Interval& b) { return a.start < b.start; });
  // Device work belongs to the step during which it started, or after which it started before
  // the next step began (a step's kernels may run on after its host side returned).
  nlohmann::json per_step = nlohmann::json::array();
  uint64_t busy_total = 0;
  int64_t kernels_total = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const uint64_t from = steps[i].start;
    const uint64_t to = i + 1 < steps.size() ? steps[i + 1].start : UINT64_MAX;
    std::vector<Interval> busy;
    int64_t launched = 0, copies = 0, memsets = 0;
    uint64_t last_end = steps[i].end;
    for (const auto& [at, type] : device) {
      if (at.start < from || at.start >= to) continue;
      busy.push_back(at);
      last_end = std::max(last_end, at.end);
      (type == kKernel ? launched : type == kMemcpy ? copies : memsets) += 1;
    }
    const uint64_t busy_ns = covered_ns(busy);
    const uint64_t span_ns = last_end - from;  // the host's step, or longer if the GPU ran on
    busy_total += busy_ns;
    kernels_total += launched;
    per_step.push_back({{"wall_ms", ms(steps[i].end - steps[i].start)},
                        {"span_ms", ms(span_ns)},
                        {"device_busy_ms", ms(busy_ns)},
                        {"device_idle_ms", ms(span_ns - std::min(span_ns, busy_ns))},
                        {"kernels", launched},
                        {"copies", copies},
                        {"memsets", memsets}});
  }
  const size_t n = steps.size();
  nlohmann::json phase_ms = nlohmann::json::object();
  for (const auto& [name, t] : phases) {
    phase_ms[name] = ms(t.ns) / static_cast<double>(std::max<size_t>(n, 1));
  }
  uint64_t kernel_ns = 0;
  for (const auto& [name, t] : kernels) kernel_ns += t.ns;
  uint64_t host_ns = 0;
  for (const Interval& s : steps) host_ns += s.end - s.start;
  return {{"steps_profiled", n},
          {"steps", per_step},
          {"host_phase_ms_per_step", phase_ms},
          {"kernels_per_step",
           n > 0 ? static_cast<double>(kernels_total) / static_cast<double>(n) : 0.0},
          {"device_busy_ms_per_step", n > 0 ? ms(busy_total) / static_cast<double>(n) : 0.0},
          {"top_kernels", top(kernels, 25, kernel_ns, n)},
          {"top_host_ops_inclusive", top(host_ops, 15, host_ns, n)}};
}

}  // namespace

struct Profiler::State {
  bool running = false;
};

Profiler::Profiler(const c10::Device& device) : state_(std::make_unique<State>()) {
  std::set<pi::ActivityType> activities{pi::ActivityType::CPU};
  if (device.is_cuda()) activities.insert(pi::ActivityType::CUDA);
  const pi::ProfilerConfig config(pi::ProfilerState::KINETO);
  kp::prepareProfiler(config, activities);
  kp::enableProfiler(
      config, activities,
      {at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION, at::RecordScope::USER_SCOPE});
  state_->running = true;
}

Profiler::~Profiler() {
  if (state_->running) {
    try {
      kp::disableProfiler();
    } catch (...) {  // a destructor: the profile is being discarded anyway
    }
  }
}

nlohmann::json Profiler::finish(const std::filesystem::path& trace_file) {
  state_->running = false;
  std::unique_ptr<kp::ProfilerResult> result = kp::disableProfiler();
  nlohmann::json summary = summarise(result->events());
  result->save(trace_file.string());
  summary["trace"] = trace_file.filename().string();
  return summary;
}

#else  // no Kineto profiler API (LibTorch < 2.1)

struct Profiler::State {};

Profiler::Profiler(const c10::Device& /*device*/) {
  throw Error(ExitCode::kUsage,
              "output.profile_steps needs LibTorch >= 2.1 (its Kineto profiler); this vlmtrain "
              "was built against LibTorch " TORCH_VERSION);
}

Profiler::~Profiler() = default;

nlohmann::json Profiler::finish(const std::filesystem::path& /*trace_file*/) { return {}; }

#endif

}  // namespace vlm::runtime
