list(APPEND COFAB_FABRIC_SOURCES
  wire/crc32c.cc
  wire/header.cc)
