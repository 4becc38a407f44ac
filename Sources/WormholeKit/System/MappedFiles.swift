/// Where a file may be written through a shared mapping (`MAP_SHARED`), which every process of the host sees.
enum MappedFiles {
    /// The file systems (`fstatfs`'s `f_type`) that write a file's blocks in place, so that a store to a page whose
    /// blocks are allocated does not need new ones (and so does not fault for lack of space, where a `pwrite` would
    /// return an error): ext2/3/4 (0xEF53) and tmpfs (0x01021994). On others (copy-on-write ones such as btrfs,
    /// network ones), and on Darwin, the wormhole makes system calls instead. A store can still fault where a `pwrite`
    /// would fail on a broken disk (a page that cannot be read back) or a file made immutable meanwhile.
    static let fileSystemsWrittenInPlace: Set<Int> = [0xEF53, 0x0102_1994]
}
