#include "model/cpu_runtime.h"

#include <ATen/Parallel.h>
#include <malloc.h>

// LibTorch's wheel links libgomp and exports MKL's per-thread setter; neither has a header there.
extern "C" void omp_set_num_threads(int threads);
extern "C" int MKL_Set_Num_Threads_Local(int threads);  // the C entry (lower case is Fortran)

namespace praxis::model {

void DefaultToOneIntraOpThread() {
  // Sets the default every new thread takes at its first parallel op, and MKL's global count.
  at::set_num_threads(1);
}

void SetIntraOpThreadsOfThisThread(int threads) {
  // LibTorch sets a thread up at its first parallel op (get_num_threads runs that set-up inside
  // libtorch; the inline lazy_init in its header keeps a flag of our own binary's): first, so
  // that it cannot undo what follows.
  (void)at::get_num_threads();
  omp_set_num_threads(threads);
  MKL_Set_Num_Threads_Local(threads);
}

void KeepFreedMemoryForReuse() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest; fixing it also stops its adjustment
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

}  // namespace praxis::model
