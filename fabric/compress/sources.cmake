# Gradient compression codecs (8-bit min-max, 1-bit sign with error feedback).
list(APPEND COFAB_FABRIC_SOURCES
  compress/codec.cc)
# The codec loops are the compressed path's inner loops.
cofab_hot_loops(compress/codec.cc)
