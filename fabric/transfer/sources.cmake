# Transfer manager: ordering policies, fusion/chunking, trace export (on top of fabric/ps).
list(APPEND COFAB_FABRIC_SOURCES
  transfer/ordering_policy.cc
  transfer/transfer_manager.cc
  transfer/transfer_trace.cc)
