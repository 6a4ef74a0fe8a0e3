#include "memory/recorded_trace.h"

#include <algorithm>
#include <deque>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

namespace vlm::memory {

namespace {

[[noreturn]] void bad_line(int64_t number, const std::string& line, const std::string& why) {
  throw std::runtime_error("memory trace line " + std::to_string(number) + " (" +
                           line.substr(0, 80) + "): " + why);
}

uint64_t hex(const std::string& text, int64_t number, const std::string& line) {
  size_t used = 0;
  uint64_t value = 0;
  try {
    value = std::stoull(text, &used, 16);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) bad_line(number, line, "not a hex address");
  return value;
}

}  // namespace

RecordedTrace read_memory_trace(std::istream& in) {
  RecordedTrace trace;
  std::string line;
  int64_t number = 0;
  // G and B lines after an S line are the step's start state, after an E line its end state.
  std::vector<CudaCachingAllocatorModel::Segment>* state = nullptr;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    if (line[0] == '#') {
      if (number == 2 && line.size() > 2) trace.platform = line.substr(2);
      if (line.find("caching allocator") != std::string::npos) trace.cuda = true;
      continue;
    }
    std::istringstream f(line);
    std::string kind;
    f >> kind;
    if (kind.size() != 1) bad_line(number, line, "unknown record");
    const char k = kind[0];
    if (k == 'S') {
      RecordedStep& s = trace.steps.emplace_back();
      if (!(f >> s.step >> s.allocated_at_start >> s.reserved_at_start)) {
        bad_line(number, line, "expected S step allocated reserved");
      }
      state = &s.start_state;
    } else if (k == 'X') {
      size_t id = 0;
      // The writer defines each context once, in order: any other id is not its output (and a
      // huge one must not size a table).
      if (!(f >> id) || id != trace.contexts.size()) {
        bad_line(number, line, "expected X id text, ids in order from 0");
      }
      std::string text;
      std::getline(f >> std::ws, text);
      trace.contexts.push_back(text);
    } else if (k == 'G') {
      std::string address;
      int64_t size = 0;
      int large = 0;
      if (state == nullptr || !(f >> address >> size >> large)) {
        bad_line(number, line, "expected G address size large stream after S or E");
      }
      state->push_back({hex(address, number, line), large != 0, {}});
    } else if (k == 'B') {
      int64_t bytes = 0;
      int allocated = 0;
      if (state == nullptr || state->empty() || !(f >> bytes >> allocated) || bytes <= 0) {
        bad_line(number, line, "expected B bytes (> 0) allocated after G");
      }
      state->back().blocks.emplace_back(bytes, allocated != 0);
    } else if (k == 'E') {
      if (trace.steps.empty()) bad_line(number, line, "E before S");
      RecordedStep& s = trace.steps.back();
      int64_t step = 0;
      if (!(f >> step >> s.peak_allocated >> s.peak_reserved >> s.allocated_at_end >>
            s.reserved_at_end) ||
          step != s.step) {
        bad_line(number, line, "expected E step peak_allocated peak_reserved allocated reserved");
      }
      s.ended = true;
      state = &s.end_state;
    } else if (std::string("AFCMUmuO").find(k) != std::string::npos) {
      if (trace.steps.empty()) bad_line(number, line, "an event before S");
      RecordedStep::Event e;
      e.kind = k;
      std::string address;
      int stream = 0;
      if (!(f >> e.bytes >> address >> stream >> e.context) || e.bytes < 0 || e.context < 0 ||
          static_cast<size_t>(e.context) >= trace.contexts.size()) {
        bad_line(number, line, "expected kind bytes (>= 0) address stream context (defined)");
      }
      e.address = hex(address, number, line);
      trace.steps.back().events.push_back(e);
      state = nullptr;
    } else {
      bad_line(number, line, "unknown record");
    }
  }
  return trace;
}

int64_t recorded_capacity(const RecordedTrace& trace) {
  bool returned = false;
  int64_t most = 0;
  for (const RecordedStep& step : trace.steps) {
    returned = returned || std::any_of(step.events.begin(), step.events.end(),
                                       [](const RecordedStep::Event& e) { return e.kind == 'U'; });
    most = std::max(most, step.peak_reserved);
  }
  return returned ? most : 0;
}

std::vector<AllocatorReplay> replay_on_allocator_model(const RecordedTrace& trace,
                                                       bool trace_addresses) {
  if (trace.steps.empty() || trace.steps.front().start_state.empty()) {
    throw std::runtime_error("the trace has no allocator state at its first step's start");
  }
  CudaCachingAllocatorModel model;
  model.load(trace.steps.front().start_state);
  model.set_capacity(recorded_capacity(trace));
  // The model's address of each block the trace names (they differ without trace addresses).
  std::unordered_map<uint64_t, uint64_t> address_of;
  for (const auto& segment : trace.steps.front().start_state) {
    uint64_t a = segment.address;
    for (const auto& [bytes, allocated] : segment.blocks) {
      if (allocated) address_of[a] = a;
      a += static_cast<uint64_t>(bytes);
    }
  }
  std::vector<AllocatorReplay> out;
  for (const RecordedStep& step : trace.steps) {
    model.reset_peaks();
    AllocatorReplay r;
    r.step = step.step;
    std::deque<std::pair<uint64_t, int64_t>> segments;  // recorded cudaMallocs not yet used
    for (const RecordedStep::Event& e : step.events) {
      if (e.kind == 'M') {
        segments.emplace_back(e.address, e.bytes);
      } else if (e.kind == 'A') {
        const bool needs = model.needs_segment(e.bytes);
        std::optional<uint64_t> at;
        if (trace_addresses && needs) {
          if (segments.empty() ||
              segments.front().second != cuda_segment_bytes(cuda_block_bytes(e.bytes))) {
            ++r.diverged;
          }
          if (!segments.empty()) at = segments.front().first;
        }
        if (trace_addresses && !needs && !segments.empty()) ++r.diverged;
        if (!segments.empty()) segments.pop_front();
        const uint64_t address = model.allocate(e.bytes, at);
        if (trace_addresses && address != e.address) ++r.diverged;
        address_of[e.address] = address;
      } else if (e.kind == 'C') {
        const auto it = address_of.find(e.address);
        if (it == address_of.end() || !model.free(it->second)) {
          throw std::runtime_error("the trace frees a block at " + std::to_string(e.address) +
                                   " that the replay does not hold");
        }
        address_of.erase(it);
      }
    }
    r.peak_allocated = model.peak_allocated_bytes();
    r.peak_reserved = model.peak_reserved_bytes();
    r.allocated_at_end = model.allocated_bytes();
    r.reserved_at_end = model.reserved_bytes();
    r.end_state_equal =
        trace_addresses && !step.end_state.empty() && model.segments() == step.end_state;
    out.push_back(r);
  }
  return out;
}

}  // namespace vlm::memory
