#include "core/heap.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "core/param.h"

namespace cofab {

COFAB_PARAM_BOOL(kHeapKeep, "COFAB_HEAP_KEEP", true,
                 "cofab-aggd and train_mnist keep freed blocks up to 32 MiB in the heap "
                 "(no mmap/munmap per message-sized buffer)");

StatusOr<bool> keepLargeBlocksInHeap() {
  COFAB_ASSIGN_OR_RETURN(const bool keep, kHeapKeep.get());
  if (!keep) return false;
#if defined(__GLIBC__)
  // 32 MiB: glibc's largest mmap threshold on 64-bit. Setting it also stops glibc's dynamic
  // threshold from moving. 256 MiB of free heap top before a trim: bounded by the peak use.
  // Both are tried: a refused one leaves the other in place, and the answer says not both.
  const bool mmapSet = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trimSet = mallopt(M_TRIM_THRESHOLD, 256 << 20) == 1;
  return mmapSet && trimSet;
#else
  return false;
#endif
}

}  // namespace cofab
