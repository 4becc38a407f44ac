#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation

/// The connections ``Wormhole/sendMessageData(_:identifier:)`` keeps to live listeners, and the `.live` directory's
/// names as last read: a message costs an `fstat` and one `send`, and the directory is read again only when it may
/// have changed.
final class LiveConnectionCache {
    /// The socket files of `.live` as last read.
    private(set) var names: [String] = []
    /// Connected sockets by socket file name.
    var sockets: [String: Int32] = [:]
    private var modified: timespec?

    /// Reads the directory again if it changed since it was last read (a listener came or went), and drops the
    /// connections of sockets that are gone.
    func refresh(_ directory: DirectoryHandle) throws(WormholeError) {
        var status = stat()
        guard fstat(directory.rawDescriptor, &status) == 0 else {
            throw WormholeError.fileSystem(currentErrno, "inspect the live directory", path: directory.path)
        }
        let stamp = status.st_mtim
        // Timestamps are coarse (a clock tick): a listener that came in the tick of the last read would leave the
        // same stamp. Only a stamp older than that tick is trusted to mean "nothing came since".
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        let age = (now.tv_sec - stamp.tv_sec) * 1_000_000_000 + (now.tv_nsec - stamp.tv_nsec)
        if let modified, modified.tv_sec == stamp.tv_sec, modified.tv_nsec == stamp.tv_nsec, age > 50_000_000 {
            return
        }
        names = try directory.entries().shuffled()
        modified = stamp
        let present = Set(names)
        for name in sockets.keys where !present.contains(name) { drop(name) }
    }

    func drop(_ name: String) {
        if let socket = sockets.removeValue(forKey: name) { _ = close(socket) }
    }

    deinit { for socket in sockets.values { _ = close(socket) } }
}
