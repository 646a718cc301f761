// Error check for cuBLAS and cuBLASLt calls (both return cublasStatus_t): a failure throws with the library's text.
#pragma once

#include <cublas_api.h>

#include <string>

#include "deepinfer/error.h"

#define DI_CUBLAS_CHECK(expr)                                                                                     \
    do {                                                                                                          \
        const cublasStatus_t di_st_ = (expr);                                                                     \
        if (di_st_ != CUBLAS_STATUS_SUCCESS)                                                                      \
            ::deepinfer::detail::throw_internal_failure(__FILE__, __LINE__, #expr,                                \
                                                        std::string("cuBLAS: ") + cublasGetStatusString(di_st_)); \
    } while (0)
