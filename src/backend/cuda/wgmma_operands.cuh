// The accumulator operands of wgmma's inline asm, written once for every form (wgmma_common.cuh, wgmma_ss.cuh):
// DI_WGMMA_REGS<N>, the placeholders "%0, %1, .., %<N-1>" of an instruction's N accumulators, and
// DI_WGMMA_ACC<N>(d), the operands "+f"(d[0]) .. "+f"(d[N - 1]) bound to them (N = 4, 8, 16, 32, 64, 128).
#pragma once

#define DI_WGMMA_REGS4 "%0, %1, %2, %3"
#define DI_WGMMA_REGS8 DI_WGMMA_REGS4 ", %4, %5, %6, %7"
#define DI_WGMMA_REGS16 DI_WGMMA_REGS8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define DI_WGMMA_REGS32 \
    DI_WGMMA_REGS16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define DI_WGMMA_REGS64                                                                                \
    DI_WGMMA_REGS32                                                                                    \
        ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, " \
        "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define DI_WGMMA_REGS128                                                                               \
    DI_WGMMA_REGS64                                                                                    \
        ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, " \
        "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, "   \
        "%100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, "   \
        "%115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

#define DI_WGMMA_ACC_AT4(d, i) "+f"(d[(i)]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3])
#define DI_WGMMA_ACC_AT8(d, i) DI_WGMMA_ACC_AT4(d, i), DI_WGMMA_ACC_AT4(d, (i) + 4)
#define DI_WGMMA_ACC_AT16(d, i) DI_WGMMA_ACC_AT8(d, i), DI_WGMMA_ACC_AT8(d, (i) + 8)
#define DI_WGMMA_ACC_AT32(d, i) DI_WGMMA_ACC_AT16(d, i), DI_WGMMA_ACC_AT16(d, (i) + 16)
#define DI_WGMMA_ACC_AT64(d, i) DI_WGMMA_ACC_AT32(d, i), DI_WGMMA_ACC_AT32(d, (i) + 32)
#define DI_WGMMA_ACC4(d) DI_WGMMA_ACC_AT4(d, 0)
#define DI_WGMMA_ACC8(d) DI_WGMMA_ACC_AT8(d, 0)
#define DI_WGMMA_ACC16(d) DI_WGMMA_ACC_AT16(d, 0)
#define DI_WGMMA_ACC32(d) DI_WGMMA_ACC_AT32(d, 0)
#define DI_WGMMA_ACC64(d) DI_WGMMA_ACC_AT64(d, 0)
#define DI_WGMMA_ACC128(d) DI_WGMMA_ACC_AT64(d, 0), DI_WGMMA_ACC_AT64(d, 64)
