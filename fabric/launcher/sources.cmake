list(APPEND COFAB_FABRIC_SOURCES
  launcher/launcher.cc
  launcher/line_prefixer.cc)
