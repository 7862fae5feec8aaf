# SPDX-License-Identifier: Apache-2.0
# kvs_require_cuda_headers(HEADER): stops the configure step with a clear
# message when HEADER (a cuda.h) is older than CUDA 12.0, which the cuda
# backend is written against (cuGetProcAddress_v2, the PFN_*_v12000 types).
# The version comes from the header itself, the one the build compiles with.
function(kvs_require_cuda_headers header)
    file(STRINGS "${header}" _line REGEX "^#define CUDA_VERSION [0-9]+")
    string(REGEX MATCH "[0-9]+" _version "${_line}")
    if(NOT _version)
        message(FATAL_ERROR "${header} defines no CUDA_VERSION: it is not a CUDA Toolkit "
                            "header; point CUDAToolkit_ROOT at a CUDA 12.0 or newer toolkit, "
                            "or configure with -DKVS_WITH_CUDA=OFF")
    endif()
    math(EXPR _major "${_version} / 1000")
    math(EXPR _minor "${_version} % 1000 / 10")
    if(_version LESS 12000)
        message(FATAL_ERROR "${header} is CUDA ${_major}.${_minor}; the cuda backend needs the "
                            "CUDA 12.0 or newer headers: install CUDA 12 or newer and point "
                            "CUDAToolkit_ROOT at it, or configure with -DKVS_WITH_CUDA=OFF "
                            "(host backend only)")
    endif()
    set(KVS_CUDA_HEADER_VERSION "${_major}.${_minor}" PARENT_SCOPE)
endfunction()

# cmake -DHEADER=... -P KvsCudaVersion.cmake: the check alone (for tests).
if(CMAKE_SCRIPT_MODE_FILE AND HEADER)
    kvs_require_cuda_headers("${HEADER}")
    message(STATUS "CUDA headers ${KVS_CUDA_HEADER_VERSION}: accepted")
endif()
