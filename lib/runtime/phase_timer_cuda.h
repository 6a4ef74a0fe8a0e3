// CUDA half of phase_timer.h, compiled only when LibTorch has CUDA (phase_timer_cuda.cpp).
#pragma once

#include <memory>

#include "runtime/phase_timer.h"

namespace vlm::runtime::detail {

// A timing event recorded on the device's current stream.
std::shared_ptr<CudaTimingEvent> cuda_record_timing_event(int device_index);
// Milliseconds between two recorded events; waits for `stop` first.
double cuda_elapsed_ms(const CudaTimingEvent& start, const CudaTimingEvent& stop);

}  // namespace vlm::runtime::detail
