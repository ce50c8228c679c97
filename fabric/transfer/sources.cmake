# Transfer manager: ordering policies, fusion/chunking, trace export, central scheduler (cofab-sched) and its client (on top of fabric/ps).
list(APPEND COFAB_FABRIC_SOURCES
  transfer/central_scheduler.cc
  transfer/ordering_policy.cc
  transfer/sched_client.cc
  transfer/transfer_manager.cc
  transfer/transfer_trace.cc)
