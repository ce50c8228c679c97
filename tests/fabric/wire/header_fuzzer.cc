// libFuzzer target for the wire header decoder (built with clang and -DCOFAB_BUILD_FUZZERS=ON):
//   ./wire_header_fuzzer -max_total_time=60
// Any input must decode to a Status or to a header that re-encodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "fabric/wire/header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto d = cofab::wire::decodeHeader({data, size}, {.maxPayload = 1u << 20});
  if (d.ok()) {
    const auto again = cofab::wire::encodeHeader(*d);
    if (std::memcmp(again.data(), data, cofab::wire::kHeaderSize) != 0) std::abort();
  }
  return 0;
}
