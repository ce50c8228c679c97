# Coded computation across processes: the coded task service (master + workers).
list(APPEND COFAB_FABRIC_SOURCES
  coded/coded_master.cc
  coded/coded_protocol.cc
  coded/coded_worker.cc
  coded/gradient_coding_client.cc
  coded/shuffle_relay.cc
  coded/shuffle_segments.cc)
# The broadcast multicast path of the coded shuffle: DPDK Ethernet broadcast frames.
if(COFAB_HAVE_DPDK)
  list(APPEND COFAB_FABRIC_SOURCES coded/shuffle_broadcast.cc)
endif()
