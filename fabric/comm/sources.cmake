# Communicator, collectives and their reduction kernels.
list(APPEND COFAB_FABRIC_SOURCES
  comm/collective_op.cc
  comm/collectives.cc
  comm/communicator.cc
  comm/direct_ops.cc
  comm/op_signature.cc
  comm/reduce_kernels.cc
  comm/ring_op.cc)
