// PTX of orion_spin(unsigned long long ns), the busy-wait kernel every sample launches (source:
// spin_kernel.cu, generated with `nvcc --ptx -arch=compute_75`). Kept as text so the samples
// build without nvcc; the driver JIT-compiles it for whatever GPU it finds. The CUDA driver test
// double recognises the kernel by name and simulates `ns` of GPU time.
//
// Usage:
//   CUmodule module;  cuModuleLoadData(&module, orion::samples::kSpinKernelPtx);
//   CUfunction spin;  cuModuleGetFunction(&spin, module, orion::samples::kSpinKernelName);
#pragma once

namespace orion::samples {

inline constexpr char kSpinKernelName[] = "orion_spin";

inline constexpr char kSpinKernelPtx[] = R"ptx(
.version 9.0
.target sm_75
.address_size 64

	// .globl	orion_spin

.visible .entry orion_spin(
	.param .u64 orion_spin_param_0
)
{
	.reg .pred 	%p<3>;
	.reg .b64 	%rd<6>;


	ld.param.u64 	%rd2, [orion_spin_param_0];
	// begin inline asm
	mov.u64 %rd3, %globaltimer;
	// end inline asm
	setp.eq.s64 	%p1, %rd2, 0;
	@%p1 bra 	$L__BB0_2;

$L__BB0_1:
	// begin inline asm
	mov.u64 %rd4, %globaltimer;
	// end inline asm
	sub.s64 	%rd5, %rd4, %rd3;
	setp.lt.u64 	%p2, %rd5, %rd2;
	@%p2 bra 	$L__BB0_1;

$L__BB0_2:
	ret;

}

)ptx";

}  // namespace orion::samples
