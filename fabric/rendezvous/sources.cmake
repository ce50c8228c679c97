list(APPEND COFAB_FABRIC_SOURCES
  rendezvous/bootstrap.cc
  rendezvous/file_store.cc
  rendezvous/hash_store.cc
  rendezvous/prefix_store.cc
  rendezvous/store.cc
  rendezvous/tcp_store.cc
  rendezvous/tcp_store_protocol.cc
  rendezvous/tcp_socket.cc
  rendezvous/tcp_store_server.cc)
