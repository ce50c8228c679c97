list(APPEND COFAB_FABRIC_SOURCES
  launcher/group_watchdog.cc
  launcher/launcher.cc
  launcher/line_prefixer.cc)
