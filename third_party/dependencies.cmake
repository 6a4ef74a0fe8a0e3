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

# LibTorch: Debian's 1.13.1 (CPU) by default; a CUDA 2.x one through -DCMAKE_PREFIX_PATH.
find_package(Torch QUIET)
vlm_require(Torch_FOUND "LibTorch" "libtorch-dev libgloo-dev libopenblas0-openmp")
# Torch's exported flags carry -D_GLIBCXX_USE_CXX11_ABI; keep them on torch targets only.
set(VLM_TORCH_HAS_CUDA OFF)
if(TARGET torch_cuda OR CUDA_FOUND OR TORCH_CUDA_LIBRARIES)
  set(VLM_TORCH_HAS_CUDA ON)
endif()
message(STATUS "vlmtrain: LibTorch ${Torch_VERSION} (CUDA: ${VLM_TORCH_HAS_CUDA})")

if(VLM_BUILD_TESTS)
  find_package(Catch2 2 QUIET)
  vlm_require(Catch2_FOUND "Catch2 v2" "catch2")
endif()
