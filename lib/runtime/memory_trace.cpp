#include "runtime/memory_trace.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "runtime/tracking_allocator.h"
#if VLM_WITH_CUDA
#include "runtime/memory_trace_cuda.h"
#endif

namespace vlm::runtime {

namespace {

// --- the op stack of each thread ----------------------------------------------------------
// RecordFunction's start and end callbacks keep a stack of the names of the scopes open on
// each thread (user scopes, autograd nodes, aten ops); an event's context is that stack.

thread_local std::vector<std::string> tls_op_stack;

std::unique_ptr<at::ObserverContext> on_scope_start(const at::RecordFunction& fn) {
  tls_op_stack.emplace_back(fn.name());
  return nullptr;
}

void on_scope_end(const at::RecordFunction& /*fn*/, at::ObserverContext* /*unused*/) {
  if (!tls_op_stack.empty()) tls_op_stack.pop_back();
}

std::string current_op_stack() {
  std::string out;
  for (const std::string& name : tls_op_stack) {
    if (!out.empty()) out += ';';
    out += name;
  }
  return out;
}

// --- the recorder -------------------------------------------------------------------------

struct Event {
  char kind;         // A alloc, F free (requested), C free completed, M / U segment alloc / free,
                     // m / u segment map / unmap (expandable segments), O out of memory
  int64_t size;      // bytes (O: the request)
  uint64_t address;  // the block's (O: CUDA, the device's free bytes; CPU, the cap)
  int32_t stream;    // CUDA: the stream's number in order of appearance; CPU: 0
  int32_t context;   // index into the contexts
};

class Recorder {
 public:
  static Recorder& instance() {
    static auto* recorder = new Recorder();  // never destroyed: allocator hooks may outlive main
    return *recorder;
  }

  bool recording() const { return recording_.load(std::memory_order_relaxed); }
  void set_recording(bool on) { recording_.store(on, std::memory_order_relaxed); }

  void add(char kind, int64_t size, uint64_t address, const void* stream) {
    if (!recording()) return;
    std::string context = current_op_stack();
    const std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back({kind, size, address, stream_id(stream), context_id(std::move(context))});
  }

  // Moves out the events so far, and the contexts not handed out before (id, text).
  void take(std::vector<Event>& events, std::vector<std::pair<int32_t, std::string>>& contexts) {
    const std::lock_guard<std::mutex> lock(mutex_);
    events.swap(events_);
    events_.clear();
    for (; contexts_written_ < contexts_.size(); ++contexts_written_) {
      contexts.emplace_back(static_cast<int32_t>(contexts_written_), contexts_[contexts_written_]);
    }
  }

  int32_t stream_number(const void* stream) {
    const std::lock_guard<std::mutex> lock(mutex_);
    return stream_id(stream);
  }

  void reset() {
    const std::lock_guard<std::mutex> lock(mutex_);
    events_.clear();
    context_ids_.clear();
    contexts_.clear();
    streams_.clear();
    contexts_written_ = 0;
  }

 private:
  int32_t context_id(std::string context) {
    const auto it = context_ids_.find(context);
    if (it != context_ids_.end()) return it->second;
    const auto id = static_cast<int32_t>(contexts_.size());
    contexts_.push_back(context);
    context_ids_.emplace(std::move(context), id);
    return id;
  }
  int32_t stream_id(const void* stream) {
    const auto it = streams_.find(stream);
    if (it != streams_.end()) return it->second;
    const auto id = static_cast<int32_t>(streams_.size());
    streams_.emplace(stream, id);
    return id;
  }

  std::atomic<bool> recording_{false};
  std::mutex mutex_;
  std::vector<Event> events_;
  std::unordered_map<std::string, int32_t> context_ids_;
  std::vector<std::string> contexts_;
  size_t contexts_written_ = 0;
  std::map<const void*, int32_t> streams_;
};

void on_cpu_allocation(char kind, const void* data, int64_t n_bytes) {
  Recorder::instance().add(kind, n_bytes, reinterpret_cast<uintptr_t>(data), nullptr);
}

std::atomic<bool> g_trace_alive{false};

}  // namespace

struct MemoryTrace::State {
  std::filesystem::path file;
  c10::Device device{c10::kCPU};
  std::ofstream out;
  at::CallbackHandle callbacks = 0;
  std::vector<Event> events;
  std::vector<std::pair<int32_t, std::string>> contexts;
};

MemoryTrace::MemoryTrace(const std::filesystem::path& file, const c10::Device& device,
                         const std::string& header)
    : state_(std::make_unique<State>()) {
  if (g_trace_alive.exchange(true)) {
    throw Error(ExitCode::kInternal, "a second memory trace was started in this process");
  }
  state_->file = file;
  state_->device = device;
  state_->out.open(file, std::ios::trunc);
  if (!state_->out) {
    g_trace_alive = false;
    throw Error(ExitCode::kUsage, "cannot write the memory trace " + file.string());
  }
  state_->out << "# vlmtrain memory trace 1 (docs/memory-trace.md)\n# " << header << "\n"
              << "# device " << device.str()
              << (device.is_cuda() ? ": the CUDA caching allocator's trace\n"
                                   : ": the tracking allocator\n");
  Recorder::instance().reset();
  if (device.is_cuda()) {
#if VLM_WITH_CUDA
    detail::cuda_attach_memory_trace(
        device.has_index() ? device.index() : 0,
        [](char kind, int64_t size, uint64_t address, const void* stream) {
          Recorder::instance().add(kind, size, address, stream);
        });
#else
    throw Error(ExitCode::kUsage, "a memory trace of " + device.str() +
                                      ": this vlmtrain was built against a LibTorch without CUDA");
#endif
  } else {
    install_cpu_tracking_allocator();
    set_allocation_observer(&on_cpu_allocation);
  }
  state_->callbacks = at::addGlobalCallback(
      at::RecordFunctionCallback(&on_scope_start, &on_scope_end)
          .needsInputs(false)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                   at::RecordScope::USER_SCOPE}));
}

MemoryTrace::~MemoryTrace() {
  Recorder::instance().set_recording(false);
  if (state_->callbacks != 0) at::removeCallback(state_->callbacks);
  if (!state_->device.is_cuda()) set_allocation_observer(nullptr);
  g_trace_alive = false;
}

const std::filesystem::path& MemoryTrace::file() const { return state_->file; }

// CUDA: the allocator's segments and their blocks (G and B lines), after S the state the step
// starts from, after E the state it ends in: a replay of the events can start where the
// allocator did and be checked block by block where it ended. Nothing on the CPU.
void MemoryTrace::write_segments() {
#if VLM_WITH_CUDA
  if (!state_->device.is_cuda()) return;
  char line[96];
  for (const auto& segment :
       detail::cuda_allocator_segments(state_->device.has_index() ? state_->device.index() : 0)) {
    std::snprintf(line, sizeof line, "G %" PRIx64 " %" PRId64 " %d %d\n", segment.address,
                  segment.size, segment.large ? 1 : 0,
                  Recorder::instance().stream_number(segment.stream));
    state_->out << line;
    for (const auto& [bytes, allocated] : segment.blocks) {
      state_->out << "B " << bytes << ' ' << (allocated ? 1 : 0) << '\n';
    }
  }
#endif
}

void MemoryTrace::begin_step(int64_t step) {
  const DeviceMemoryStats stats = memory_stats(state_->device);
  state_->out << "S " << step << ' ' << stats.allocated_bytes << ' ' << stats.reserved_bytes
              << '\n';
  write_segments();
  Recorder::instance().set_recording(true);
}

void MemoryTrace::end_step(int64_t step) {
  Recorder& recorder = Recorder::instance();
  recorder.set_recording(false);
  const DeviceMemoryStats stats = memory_stats(state_->device);
  state_->events.clear();
  state_->contexts.clear();
  recorder.take(state_->events, state_->contexts);
  std::ofstream& out = state_->out;
  for (const auto& [id, text] : state_->contexts) out << "X " << id << ' ' << text << '\n';
  char line[96];
  for (const Event& e : state_->events) {
    std::snprintf(line, sizeof line, "%c %" PRId64 " %" PRIx64 " %d %d\n", e.kind, e.size,
                  e.address, e.stream, e.context);
    out << line;
  }
  out << "E " << step << ' ' << stats.peak_allocated_bytes << ' ' << stats.peak_reserved_bytes
      << ' ' << stats.allocated_bytes << ' ' << stats.reserved_bytes << '\n';
  write_segments();
  out.flush();
  if (!out) throw Error(ExitCode::kUsage, "cannot write the memory trace " + state_->file.string());
}

struct PhaseScope::Impl {
  at::RecordFunction guard{at::RecordScope::USER_SCOPE};
};

PhaseScope::PhaseScope(const char* name) : impl_(std::make_unique<Impl>()) {
  if (impl_->guard.isActive()) {
    at::detail::record_function_with_scope(impl_->guard, name, c10::ArrayRef<const c10::IValue>{});
  }
}

PhaseScope::~PhaseScope() = default;

}  // namespace vlm::runtime
