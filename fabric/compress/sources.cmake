# Gradient compression codecs (8-bit min-max, 1-bit sign with error feedback).
list(APPEND COFAB_FABRIC_SOURCES
  compress/codec.cc)
# The codec loops are the compressed path's inner loops: -O3 lets GCC vectorise them.
set_source_files_properties(compress/codec.cc PROPERTIES COMPILE_OPTIONS "-O3")
