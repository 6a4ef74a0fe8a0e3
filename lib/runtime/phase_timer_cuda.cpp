#include "runtime/phase_timer_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>

namespace vlm::runtime::detail {

struct CudaTimingEvent {
  at::cuda::CUDAEvent event{cudaEventDefault};  // the default flags would disable timing
};

std::shared_ptr<CudaTimingEvent> cuda_record_timing_event(int device_index) {
  auto e = std::make_shared<CudaTimingEvent>();
  e->event.record(at::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_index)));
  return e;
}

double cuda_elapsed_ms(const CudaTimingEvent& start, const CudaTimingEvent& stop) {
  stop.event.synchronize();
  return static_cast<double>(start.event.elapsed_time(stop.event));
}

}  // namespace vlm::runtime::detail
