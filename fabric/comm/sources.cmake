# Communicator, collectives and their reduction kernels.
list(APPEND COFAB_FABRIC_SOURCES
  comm/collective_op.cc
  comm/collectives.cc
  comm/communicator.cc
  comm/direct_ops.cc
  comm/op_signature.cc
  comm/reduce_kernels.cc
  comm/ring_op.cc)
# The reduction kernels (widening bf16 loops included) are the collectives' hot loop.
cofab_hot_loops(comm/reduce_kernels.cc)
