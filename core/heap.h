// Process heap policy for cofab's own binaries (cofab-aggd, train_mnist).
#pragma once

#include "core/status.h"

namespace cofab {

// Keeps freed message-sized blocks (up to 32 MiB) in the process heap instead of handing them
// back to the kernel. glibc serves blocks above its mmap threshold with mmap and unmaps them on
// free, and trims arenas whose free top passes a small threshold, so a buffer of a step's size
// allocated and freed every step costs fresh pages each time: page faults, kernel zeroing,
// munmap. A ssp worker spent about half its CPU in the kernel that way (docs/OPERATIONS.md,
// "Heap"); with this, the same job ran 25% more samples/s.
//
// A process-wide malloc setting, so cofab's library never applies it on its own: cofab-aggd
// and train_mnist call it at start, and a training binary may call it too (or set
// GLIBC_TUNABLES=glibc.malloc.mmap_threshold=...:glibc.malloc.trim_threshold=...).
// COFAB_HEAP_KEEP=0 leaves malloc as it is. Returns whether both settings were applied (false
// without glibc, or under a sanitizer's allocator); InvalidArgument for a malformed
// COFAB_HEAP_KEEP.
StatusOr<bool> keepLargeBlocksInHeap();

}  // namespace cofab
