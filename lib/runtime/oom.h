// Recognising out-of-memory failures, whichever layer raised them.
#pragma once

#include <exception>
#include <string_view>

namespace vlm::runtime {

// True for c10::OutOfMemoryError (CUDA caching allocator, the budgeted CPU allocator),
// std::bad_alloc, and any other exception whose message names an allocation failure:
// "out of memory" in any case (CUDA runtime, NCCL's "Cuda failure 'out of memory'"),
// CUBLAS_STATUS_ALLOC_FAILED, CUDNN_STATUS_ALLOC_FAILED, cudaErrorMemoryAllocation,
// NCCL's "Failed to CUDA calloc/malloc", and the default CPU allocator's "can't allocate memory"
// (1.13) / "not enough memory" (2.x). Use it in a catch of std::exception placed where both
// c10::OutOfMemoryError and c10::Error can arrive.
bool is_out_of_memory(const std::exception& error);
bool is_out_of_memory(std::exception_ptr error);

// The message test alone (exposed for tests and for errors that arrive as text, e.g. from a
// collective's failure message).
bool message_names_out_of_memory(std::string_view message);

}  // namespace vlm::runtime
