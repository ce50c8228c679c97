list(APPEND COFAB_FABRIC_SOURCES
  wire/crc32c.cc
  wire/crc32c_fold.cc
  wire/header.cc)
