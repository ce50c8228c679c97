# Communicator, collectives and their reduction kernels.
list(APPEND COFAB_FABRIC_SOURCES
  comm/collective_op.cc
  comm/collectives.cc
  comm/communicator.cc
  comm/direct_ops.cc
  comm/op_signature.cc
  comm/reduce_kernels.cc
  comm/ring_op.cc)
# -O3: GCC's -O2 cost model leaves the widening bf16 loops scalar; the kernels are the hot loop.
set_source_files_properties(comm/reduce_kernels.cc PROPERTIES COMPILE_OPTIONS -O3)
