// The one place that knows whether ISA-L is built in (DESIGN.md §4: #if only in factories).
#include "coding/erasure/gf_kernels.h"

#include "core/config.h"

namespace cofab::coding {

#if COFAB_HAVE_ISAL
const GfKernels& isalGfKernels();  // gf_kernels_isal.cc
#endif

StatusOr<const GfKernels*> gfKernels(RsBackend backend) {
  switch (backend) {
    case RsBackend::kReference:
      return &referenceGfKernels();
    case RsBackend::kAuto:
#if COFAB_HAVE_ISAL
      return &isalGfKernels();
#else
      return &referenceGfKernels();
#endif
    case RsBackend::kIsal:
#if COFAB_HAVE_ISAL
      return &isalGfKernels();
#else
      return Unavailable(
          "Reed-Solomon backend 'isal' requested but cofab was built without ISA-L "
          "(COFAB_WITH_ISAL=OFF or libisal-dev missing); use RsBackend::kAuto or kReference");
#endif
  }
  return InvalidArgument("unknown Reed-Solomon backend " +
                         std::to_string(static_cast<int>(backend)));
}

}  // namespace cofab::coding
