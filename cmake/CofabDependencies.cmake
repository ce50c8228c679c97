# Optional backends (DESIGN.md §4): COFAB_WITH_<X> is AUTO (on if found), ON (missing is a
# configure error) or OFF. Each sets COFAB_HAVE_<X> to 0/1 for core/config.h.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)

macro(cofab_option name doc)
  set(COFAB_WITH_${name} AUTO CACHE STRING "${doc}: AUTO, ON or OFF")
  set_property(CACHE COFAB_WITH_${name} PROPERTY STRINGS AUTO ON OFF)
endmacro()

function(cofab_resolve name found reason)
  set(mode ${COFAB_WITH_${name}})
  if(mode STREQUAL "OFF")
    set(COFAB_HAVE_${name} 0 PARENT_SCOPE)
  elseif(found)
    set(COFAB_HAVE_${name} 1 PARENT_SCOPE)
  elseif(mode STREQUAL "AUTO")
    message(STATUS "cofab: ${name} not found (${reason}); building without it")
    set(COFAB_HAVE_${name} 0 PARENT_SCOPE)
  else()
    message(FATAL_ERROR "COFAB_WITH_${name}=ON but ${name} was not found: ${reason}. "
                        "Run scripts/setup.sh, or configure with -DCOFAB_WITH_${name}=OFF.")
  endif()
endfunction()

cofab_option(ISAL "Intel ISA-L erasure coding")
cofab_option(DPDK "DPDK kernel-bypass transport")
cofab_option(RDMA "RDMA verbs transport (headers only: libibverbs is dlopen'd)")
cofab_option(CUDA "CUDA kernels")

if(NOT COFAB_WITH_ISAL STREQUAL "OFF")
  pkg_check_modules(ISAL IMPORTED_TARGET libisal)
endif()
cofab_resolve(ISAL "${ISAL_FOUND}" "pkg-config libisal (Debian: libisal-dev)")

if(NOT COFAB_WITH_DPDK STREQUAL "OFF")
  pkg_check_modules(DPDK IMPORTED_TARGET libdpdk)
endif()
cofab_resolve(DPDK "${DPDK_FOUND}" "pkg-config libdpdk (Debian: libdpdk-dev)")

if(NOT COFAB_WITH_RDMA STREQUAL "OFF")
  find_path(IBVERBS_INCLUDE_DIR infiniband/verbs.h)
endif()
if(IBVERBS_INCLUDE_DIR)
  set(_rdma_found TRUE)
else()
  set(_rdma_found FALSE)
endif()
cofab_resolve(RDMA "${_rdma_found}" "infiniband/verbs.h (Debian: libibverbs-dev)")

set(_cuda_found FALSE)
if(NOT COFAB_WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "80;90")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    # .cu files include core headers, which are C++20 (CXX_STANDARD carries over to CUDA
    # sources). CMake 3.25 does not know nvcc 13's flag for it, so it is named here, for every
    # folder with CUDA sources (gpu/, tests/gpu/).
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(_cuda_found TRUE)
  endif()
endif()
cofab_resolve(CUDA "${_cuda_found}" "nvcc (CUDA Toolkit at /usr/local/cuda)")

# BLAS (OpenBLAS from Debian) is required by coding/: matrix products go through it.
pkg_check_modules(OPENBLAS IMPORTED_TARGET openblas)
if(NOT OPENBLAS_FOUND)
  message(FATAL_ERROR "OpenBLAS not found (pkg-config openblas). Run scripts/setup.sh "
                      "(Debian: libopenblas-dev).")
endif()
