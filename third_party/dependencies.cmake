# Finds every dependency. A missing one stops configuration with the Debian package that
# provides it (scripts/install-deps.sh installs them all). Versions we build against are in
# third_party/README.md.

function(vlm_require found what package)
  if(NOT ${found})
    message(FATAL_ERROR
      "vlmtrain: ${what} not found. On Debian/Ubuntu: apt-get install ${package}\n"
      "(or run: bash scripts/install-deps.sh)")
  endif()
endfunction()

find_package(PkgConfig QUIET)
vlm_require(PKG_CONFIG_FOUND "pkg-config" "pkg-config")

find_package(yaml-cpp QUIET)
vlm_require(yaml-cpp_FOUND "yaml-cpp" "libyaml-cpp-dev")
find_package(spdlog QUIET)
vlm_require(spdlog_FOUND "spdlog" "libspdlog-dev")
find_package(nlohmann_json 3.9 QUIET)
vlm_require(nlohmann_json_FOUND "nlohmann-json (>= 3.9)" "nlohmann-json3-dev")
find_package(CLI11 QUIET)
vlm_require(CLI11_FOUND "CLI11" "libcli11-dev")

pkg_check_modules(TURBOJPEG QUIET IMPORTED_TARGET libturbojpeg)
vlm_require(TURBOJPEG_FOUND "libturbojpeg" "libturbojpeg0-dev")
pkg_check_modules(PNG QUIET IMPORTED_TARGET libpng)
vlm_require(PNG_FOUND "libpng" "libpng-dev")
pkg_check_modules(STB QUIET IMPORTED_TARGET stb)
vlm_require(STB_FOUND "stb (stb_image, stb_image_write)" "libstb-dev")
pkg_check_modules(PCRE2 QUIET IMPORTED_TARGET libpcre2-8)
vlm_require(PCRE2_FOUND "PCRE2" "libpcre2-dev")

# yaml-cpp 0.7 on Debian exports the target `yaml-cpp`; newer versions `yaml-cpp::yaml-cpp`.
if(TARGET yaml-cpp::yaml-cpp)
  set(VLM_YAML_TARGET yaml-cpp::yaml-cpp)
else()
  set(VLM_YAML_TARGET yaml-cpp)
endif()

find_package(Threads REQUIRED)

# A fuzzing build (VLM_FUZZ) has the torch-free layers only.
if(VLM_FUZZ)
  return()
endif()

# LibTorch (docs/development.md, "Two LibTorch versions"):
#   VLM_LIBTORCH=pinned  the 2.x of third_party/libtorch.txt that scripts/install-deps.sh puts
#                        in .deps/libtorch/ (the default when it is there);
#   VLM_LIBTORCH=system  Debian's 1.13.1 (CPU), kept for the memory model's byte-exact tests;
#   VLM_LIBTORCH=path    whatever -DCMAKE_PREFIX_PATH or -DTorch_DIR points at (a GPU machine's).
set(VLM_PINNED_TORCH_DIR "${PROJECT_SOURCE_DIR}/.deps/libtorch/torch/share/cmake/Torch")
set(VLM_SYSTEM_TORCH_DIR "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake/Torch")
set(_vlm_libtorch_default system)
if(CMAKE_PREFIX_PATH OR (Torch_DIR AND NOT Torch_DIR STREQUAL VLM_SYSTEM_TORCH_DIR
                         AND NOT Torch_DIR STREQUAL VLM_PINNED_TORCH_DIR))
  set(_vlm_libtorch_default path)
elseif(EXISTS "${VLM_PINNED_TORCH_DIR}/TorchConfig.cmake")
  set(_vlm_libtorch_default pinned)
endif()
set(VLM_LIBTORCH ${_vlm_libtorch_default} CACHE STRING "Which LibTorch: pinned, system or path")
set_property(CACHE VLM_LIBTORCH PROPERTY STRINGS pinned system path)
if(VLM_LIBTORCH STREQUAL "pinned")
  if(NOT EXISTS "${VLM_PINNED_TORCH_DIR}/TorchConfig.cmake")
    message(FATAL_ERROR "vlmtrain: the pinned LibTorch is not installed in .deps/libtorch/ "
                        "(run: bash scripts/install-deps.sh)")
  endif()
  # Its Caffe2 config needs the CUDA toolkit's headers and libraries (found from nvcc).
  find_program(VLM_NVCC nvcc HINTS ENV CUDA_PATH ENV CUDAToolkit_ROOT PATH_SUFFIXES bin
               PATHS /usr/local/cuda/bin)
  if(NOT VLM_NVCC)
    message(FATAL_ERROR "vlmtrain: the pinned LibTorch (.deps/libtorch/) is a CUDA build and "
                        "needs the CUDA 13.0 toolkit (nvcc on the PATH, or CUDA_PATH); without "
                        "one, build against Debian's 1.13: -DVLM_LIBTORCH=system")
  endif()
  # TorchConfig looks for Caffe2 and its libraries in the system's paths before its own folder,
  # and Debian's 1.13 may live there: its folders are named first.
  set(Torch_DIR "${VLM_PINNED_TORCH_DIR}" CACHE PATH "" FORCE)
  set(Caffe2_DIR "${VLM_PINNED_TORCH_DIR}/../Caffe2" CACHE PATH "" FORCE)
  set(_vlm_library_path ${CMAKE_LIBRARY_PATH})
  list(PREPEND CMAKE_LIBRARY_PATH "${VLM_PINNED_TORCH_DIR}/../../../lib")
  find_package(Torch REQUIRED)
  set(CMAKE_LIBRARY_PATH ${_vlm_library_path})
elseif(VLM_LIBTORCH STREQUAL "system")
  set(Torch_DIR "${VLM_SYSTEM_TORCH_DIR}" CACHE PATH "" FORCE)
  find_package(Torch QUIET)
  vlm_require(Torch_FOUND "LibTorch" "libtorch-dev libgloo-dev libopenblas0-openmp")
elseif(VLM_LIBTORCH STREQUAL "path")
  find_package(Torch)  # aloud: a LibTorch was pointed at, so show why it did not load
  vlm_require(Torch_FOUND "LibTorch" "libtorch-dev libgloo-dev libopenblas0-openmp")
else()
  message(FATAL_ERROR "vlmtrain: VLM_LIBTORCH is '${VLM_LIBTORCH}'; expected pinned, system "
                      "or path")
endif()
# Torch's exported flags carry -D_GLIBCXX_USE_CXX11_ABI; keep them on torch targets only.
set(VLM_TORCH_HAS_CUDA OFF)
if(TARGET torch_cuda OR CUDA_FOUND OR TORCH_CUDA_LIBRARIES)
  set(VLM_TORCH_HAS_CUDA ON)
endif()

# Gloo: LibTorch's c10d headers for it include gloo's own headers, which Debian ships
# (libgloo-dev) but PyTorch wheels and the LibTorch archive do not. Without them the gloo
# backend is left out (NCCL carries a CUDA build; `backend: gloo` then names the reason).
include(CheckIncludeFileCXX)
set(CMAKE_REQUIRED_INCLUDES ${TORCH_INCLUDE_DIRS})
set(CMAKE_REQUIRED_QUIET ON)
check_include_file_cxx(gloo/algorithm.h VLM_HAVE_GLOO_HEADERS)
unset(CMAKE_REQUIRED_INCLUDES)
unset(CMAKE_REQUIRED_QUIET)
option(VLM_WITH_GLOO "Build the Gloo backend (needs gloo's headers)" ${VLM_HAVE_GLOO_HEADERS})

# fmt: PyTorch wheels and the LibTorch archive bundle their own fmt (11 and later) in Torch's
# include folder, which the compiler searches before the system's. spdlog built against an
# external fmt (Debian's 1.10 with fmt 9) does not compile against fmt 11. The torch targets
# therefore search a copy of spdlog's fmt headers first (vlm_fmt_first below); torch's own
# libraries keep the fmt they were built with (a versioned inline namespace, so no clash).
set(VLM_FMT_FIRST_DIR "")
get_target_property(_spdlog_defs spdlog::spdlog INTERFACE_COMPILE_DEFINITIONS)
if(_spdlog_defs MATCHES "SPDLOG_FMT_EXTERNAL" AND TARGET fmt::fmt)
  set(_torch_fmt "")
  foreach(_dir IN LISTS TORCH_INCLUDE_DIRS)
    if(EXISTS "${_dir}/fmt/core.h")
      set(_torch_fmt "${_dir}/fmt")
    endif()
  endforeach()
  get_target_property(_fmt_includes fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
  foreach(_dir IN LISTS _fmt_includes)
    if(_torch_fmt AND EXISTS "${_dir}/fmt/core.h" AND NOT "${_dir}/fmt" STREQUAL _torch_fmt)
      set(VLM_FMT_FIRST_DIR "${CMAKE_BINARY_DIR}/fmt_for_spdlog")
      file(COPY "${_dir}/fmt" DESTINATION "${VLM_FMT_FIRST_DIR}")
      message(STATUS "vlmtrain: LibTorch bundles fmt; torch targets use spdlog's (${_dir}/fmt)")
      break()
    endif()
  endforeach()
endif()
# Puts spdlog's fmt ahead of Torch's bundled one on a torch target (no-op where none is bundled).
function(vlm_fmt_first target)
  if(VLM_FMT_FIRST_DIR)
    target_include_directories(${target} SYSTEM BEFORE PRIVATE "${VLM_FMT_FIRST_DIR}")
  endif()
endfunction()

message(STATUS "vlmtrain: LibTorch ${Torch_VERSION} (CUDA: ${VLM_TORCH_HAS_CUDA}, "
               "Gloo: ${VLM_WITH_GLOO})")

if(VLM_BUILD_TESTS)
  find_package(Catch2 2 QUIET)
  vlm_require(Catch2_FOUND "Catch2 v2" "catch2")
endif()
