// Source of the one kernel every sample launches: orion_spin busy-waits for `ns` nanoseconds of
// GPU time, read from %globaltimer, so a sample controls exactly how long each kernel occupies
// the GPU. The samples embed the PTX generated from this file (spin_kernel.h), so building them
// needs no nvcc. Regenerate with:
//   nvcc --ptx -arch=compute_75 -o spin_kernel.ptx spin_kernel.cu
// and paste the PTX into kSpinKernelPtx in spin_kernel.h.
extern "C" __global__ void orion_spin(unsigned long long ns) {
  unsigned long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  unsigned long long now = start;
  while (now - start < ns) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  }
}
