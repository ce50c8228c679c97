// libFuzzer target for the wire header decoder (built with clang and -DCOFAB_BUILD_FUZZERS=ON):
//   ./wire_header_fuzzer -max_total_time=60
// Any input must decode to a Status or to a header that re-encodes to the same bytes. Each input
// is decoded twice: as it is, and with its header CRC recomputed, because no mutation gets past a
// CRC32C by chance and every field check behind it would otherwise go unexplored.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "fabric/wire/crc32c.h"
#include "fabric/wire/header.h"

namespace {

void decodeAndCompare(const uint8_t* data, size_t size) {
  auto d = cofab::wire::decodeHeader({data, size}, {.maxPayload = 1u << 20});
  if (d.ok()) {
    const auto again = cofab::wire::encodeHeader(*d);
    if (std::memcmp(again.data(), data, cofab::wire::kHeaderSize) != 0) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using cofab::wire::kHeaderSize;
  decodeAndCompare(data, size);
  if (size >= kHeaderSize) {
    // The header CRC is its last 4 bytes, little-endian, over the bytes before it (docs/WIRE.md).
    std::array<uint8_t, kHeaderSize> sealed;
    std::memcpy(sealed.data(), data, kHeaderSize);
    const uint32_t crc = cofab::wire::crc32c(0, sealed.data(), kHeaderSize - 4);
    for (size_t i = 0; i < 4; ++i)
      sealed[kHeaderSize - 4 + i] = static_cast<uint8_t>(crc >> (8 * i));
    decodeAndCompare(sealed.data(), sealed.size());
  }
  return 0;
}
