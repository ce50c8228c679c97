# Coded computation across processes: the coded task service (master + workers).
list(APPEND COFAB_FABRIC_SOURCES
  coded/coded_master.cc
  coded/coded_protocol.cc
  coded/coded_worker.cc
  coded/gradient_coding_client.cc
  coded/shuffle_relay.cc)
