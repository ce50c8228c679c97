#include "coding/shuffle/xor_bytes.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/config.h"
#include "gpu/xor_math.h"

#if COFAB_HAVE_ISAL
#include <isa-l/raid.h>
#endif

namespace cofab::coding {

void xorInto(uint8_t* dst, const uint8_t* src, size_t bytes) {
  // Word at a time through memcpy (alignment-agnostic, vectorised by the compiler); the word
  // operation is the one the GPU kernel uses (gpu/xor_math.h).
  const gpu::XorWords op;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t a, b;
    std::memcpy(&a, dst + i, 8);
    std::memcpy(&b, src + i, 8);
    a = op(a, b);
    std::memcpy(dst + i, &a, 8);
  }
  for (; i < bytes; ++i) dst[i] = op.byte(dst[i], src[i]);
}

void xorOf(uint8_t* dst, std::span<const uint8_t* const> srcs, size_t bytes) {
  // dst may be one of the sources (an in-place fold). Copying srcs[0] into it first would then
  // overwrite a source before it is read; and a source listed twice cancels (x ^ x = 0).
  const size_t dstListed = static_cast<size_t>(std::count(srcs.begin(), srcs.end(), dst));
#if COFAB_HAVE_ISAL
  // xor_gen wants >= 2 sources, 32-byte aligned pointers and, to stay on its fast path, a length
  // that is a multiple of 32 and fits an int. It is not documented to allow dst among them.
  bool aligned = dstListed == 0 && srcs.size() >= 2 && bytes % 32 == 0 && bytes <= (1u << 30) &&
                 reinterpret_cast<uintptr_t>(dst) % 32 == 0;
  for (const uint8_t* s : srcs) aligned = aligned && reinterpret_cast<uintptr_t>(s) % 32 == 0;
  if (aligned) {
    std::vector<void*> array;
    for (const uint8_t* s : srcs) array.push_back(const_cast<uint8_t*>(s));
    array.push_back(dst);
    if (xor_gen(static_cast<int>(array.size()), static_cast<int>(bytes), array.data()) == 0) return;
  }
#endif
  // An odd number of dst entries leaves dst's own value in the result: fold the others into it.
  // An even number cancels it: the first other source overwrites it.
  bool started = dstListed % 2 == 1;
  for (const uint8_t* s : srcs) {
    if (s == dst) continue;
    if (started) {
      xorInto(dst, s, bytes);
    } else {
      std::memmove(dst, s, bytes);
      started = true;
    }
  }
  if (!started) std::memset(dst, 0, bytes);  // no sources, or dst listed an even number of times
}

}  // namespace cofab::coding
