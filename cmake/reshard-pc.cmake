# Writes and installs a pkg-config file (reshard.pc, reshard_models.pc). Runs
# at install time (from install(CODE)
# in CMakeLists.txt), because only then is the real prefix known:
# `cmake --install --prefix DIR` overrides the configure-time one. Paths in
# the file are absolute, so pkg-config recognises system directories and
# leaves them out of the flags.
#
# In: RESHARD_PC_IN, RESHARD_PC_OUT (template and scratch output),
#     RESHARD_PC_LIBDIR, RESHARD_PC_INCLUDEDIR (GNUInstallDirs values,
#     relative to the prefix or absolute), PROJECT_VERSION,
#     PROJECT_DESCRIPTION. CMAKE_INSTALL_PREFIX is set by cmake --install.

set(RESHARD_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
foreach(dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${RESHARD_PC_${dir}}")
    set(RESHARD_PC_FULL_${dir} "${RESHARD_PC_${dir}}")
  else()
    set(RESHARD_PC_FULL_${dir} "\${prefix}/${RESHARD_PC_${dir}}")
  endif()
endforeach()
configure_file("${RESHARD_PC_IN}" "${RESHARD_PC_OUT}" @ONLY)

if(IS_ABSOLUTE "${RESHARD_PC_LIBDIR}")
  set(RESHARD_PC_DEST "${RESHARD_PC_LIBDIR}/pkgconfig")
else()
  set(RESHARD_PC_DEST "${CMAKE_INSTALL_PREFIX}/${RESHARD_PC_LIBDIR}/pkgconfig")
endif()
# file(INSTALL) honours DESTDIR and records the file in install_manifest.
file(INSTALL DESTINATION "${RESHARD_PC_DEST}" TYPE FILE
     FILES "${RESHARD_PC_OUT}")
