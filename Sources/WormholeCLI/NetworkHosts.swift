import Foundation
import Synchronization

/// Several "hosts" on this machine, for the tests and the demo: network namespaces, each joined to the root namespace
/// by a veth pair of its own, so that a link between a host and the server can be cut and restored.
///
/// Host `i` reaches a server of the root namespace at ``serverAddress(_:)`` (the root side of its pair), and is seen
/// from there at ``hostAddress(_:)``; nothing else is routed, and no address but those and loopback is added. The
/// pairs take a /24 of 10.201.0.0/16–10.250.0.0/16 that no address or route of the machine overlaps, and names made
/// of this process's id and a counter, so that instances in parallel (tests, processes) never clash. Needs root.
///
/// ```swift
/// let hosts = try NetworkHosts(count: 2)
/// defer { hosts.close() }
/// let server = try LocalPostgresServer(listenAddresses: hosts.serverAddresses)
/// let peer = try ChildProcess(executable: "/usr/bin/env", arguments: hosts.command(0, ["wormhole", "…"])) { _ in }
/// try hosts.cutLink(0)
/// ```
package final class NetworkHosts: Sendable {
    /// The namespaces, one a host.
    private let namespaces: [String]

    /// The root sides of the veth pairs.
    private let rootInterfaces: [String]

    /// The host sides of the veth pairs, inside the namespaces.
    private let hostInterfaces: [String]

    /// The root sides' addresses, one a host: where host `i` reaches a server of the root namespace.
    package let serverAddresses: [String]

    /// The host sides' addresses.
    private let hostAddresses: [String]

    /// Whether ``close()`` ran.
    private let closed = Atomic<Bool>(false)

    /// Numbers the instances of this process, so that their names and subnets differ.
    private static let instances = Atomic<Int>(0)

    /// The second octet of the first /16 the pairs' subnets come from: 10.201.0.0/16.
    private static let firstSecondOctet = 201

    /// How many /16s the subnets come from: 10.201 through 10.250.
    private static let secondOctets = 50

    /// The most hosts one instance makes: the /30s of its /24.
    private static let maximumCount = 64

    /// Makes `count` hosts.
    ///
    /// Namespaces and pairs left behind by processes that died are deleted first.
    ///
    /// - Throws: ``NetworkHostsError`` when a step fails (not root, no `ip`); nothing is left behind.
    package init(count: Int) throws {
        guard (1...Self.maximumCount).contains(count) else {
            throw NetworkHostsError("NetworkHosts makes 1 to \(Self.maximumCount) hosts, not \(count).")
        }
        let process = getpid()
        let instance = Self.instances.wrappingAdd(1, ordering: .relaxed).oldValue
        // Interface names have 15 bytes at most: `whr`, the process id in base 36 (5 digits at most), and the
        // instance and host numbers (2 digits each).
        let interfaceSuffixes = (0..<count).map { host in
            "\(String(process, radix: 36))-\(String(instance % 1296, radix: 36))-\(String(host, radix: 36))"
        }
        let namespaces = (0..<count).map { "wh-\(process)-\(instance)-\($0)" }
        let rootInterfaces = interfaceSuffixes.map { "whr" + $0 }
        let hostInterfaces = interfaceSuffixes.map { "whh" + $0 }
        // Under a lock shared by every process, so that no two instances pick the same subnet.
        let subnet = try Self.withSetupLock {
            Self.removeStaleHosts()
            let subnet = try Self.freeSubnet(preferring: Int(process) &* 64 &+ instance)
            var made = 0
            do {
                for host in 0..<count {
                    made = host + 1
                    try Self.makeHost(
                        namespace: namespaces[host],
                        rootInterface: rootInterfaces[host],
                        hostInterface: hostInterfaces[host],
                        rootAddress: "\(subnet).\(host * 4 + 1)",
                        hostAddress: "\(subnet).\(host * 4 + 2)"
                    )
                }
            } catch {
                Self.remove(namespaces: namespaces.prefix(made), rootInterfaces: rootInterfaces.prefix(made))
                throw error
            }
            return subnet
        }
        self.namespaces = namespaces
        self.rootInterfaces = rootInterfaces
        self.hostInterfaces = hostInterfaces
        serverAddresses = (0..<count).map { "\(subnet).\($0 * 4 + 1)" }
        hostAddresses = (0..<count).map { "\(subnet).\($0 * 4 + 2)" }
    }

    deinit { close() }

    /// How many hosts there are.
    package var count: Int { namespaces.count }

    /// Host `i`'s address, as a server of the root namespace sees it.
    package func hostAddress(_ i: Int) -> String { hostAddresses[i] }

    /// The address at which host `i` reaches a server of the root namespace: the root side of its pair.
    package func serverAddress(_ i: Int) -> String { serverAddresses[i] }

    /// The name of host `i`'s network namespace.
    package func namespace(_ i: Int) -> String { namespaces[i] }

    /// The command line that runs `arguments` inside host `i`, for the caller to launch: `ip netns exec NAME …`.
    package func command(_ i: Int, _ arguments: [String]) -> [String] {
        ["ip", "netns", "exec", namespaces[i]] + arguments
    }

    /// Cuts host `i` off: its pair's root side goes down, so that nothing passes either way (connections stall, as
    /// across a broken network, rather than being reset).
    package func cutLink(_ i: Int) throws {
        try Self.ip(["link", "set", rootInterfaces[i], "down"])
    }

    /// Joins host `i` again after ``cutLink(_:)``: both sides of its pair go up.
    package func restoreLink(_ i: Int) throws {
        try Self.ip(["link", "set", rootInterfaces[i], "up"])
        try Self.ip(["-n", namespaces[i], "link", "set", hostInterfaces[i], "up"])
    }

    /// Deletes the pairs and the namespaces. Calling it again does nothing.
    ///
    /// A process still running inside a host keeps its namespace alive until it exits, but not its name nor its link.
    package func close() {
        guard !closed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        Self.remove(namespaces: namespaces[...], rootInterfaces: rootInterfaces[...])
    }

    /// Why no hosts can be made on this machine; nil when they can (root, and `ip netns add` and `del` work).
    package static func unavailableReason() -> String? {
        guard getuid() == 0 else { return "Network namespaces need root (CAP_NET_ADMIN), and this process is not." }
        guard FinishedCommand.executablePath(named: "ip") != nil else {
            return "The `ip` command is missing: install iproute2 (apt-get install iproute2)."
        }
        let probe = "wh-\(getpid())-probe"
        let added = FinishedCommand.run(["ip", "netns", "add", probe], timeout: 30)
        guard added.succeeded else { return "Network namespaces cannot be made here. " + added.summary }
        let deleted = FinishedCommand.run(["ip", "netns", "del", probe], timeout: 30)
        guard deleted.succeeded else { return "Network namespaces cannot be deleted here. " + deleted.summary }
        return nil
    }
}

// MARK: - Steps

extension NetworkHosts {
    /// Makes one host: its namespace with loopback up, and its pair with an address and up on either side. IPv6 makes
    /// no link-local addresses on the pair, so that it holds only the addresses given.
    private static func makeHost(
        namespace: String,
        rootInterface: String,
        hostInterface: String,
        rootAddress: String,
        hostAddress: String
    ) throws {
        try ip(["netns", "add", namespace])
        try ip(["link", "add", rootInterface, "type", "veth", "peer", "name", hostInterface, "netns", namespace])
        try ip(["link", "set", "dev", rootInterface, "addrgenmode", "none"])
        try ip(["address", "add", rootAddress + "/30", "dev", rootInterface])
        try ip(["link", "set", rootInterface, "up"])
        try ip(["-n", namespace, "link", "set", "dev", hostInterface, "addrgenmode", "none"])
        try ip(["-n", namespace, "address", "add", hostAddress + "/30", "dev", hostInterface])
        try ip(["-n", namespace, "link", "set", hostInterface, "up"])
        try ip(["-n", namespace, "link", "set", "lo", "up"])
    }

    /// Deletes pairs (from the root side, which takes the host side along) and namespaces, whatever fails.
    private static func remove(namespaces: ArraySlice<String>, rootInterfaces: ArraySlice<String>) {
        for interface in rootInterfaces { _ = FinishedCommand.run(["ip", "link", "del", interface], timeout: 30) }
        for namespace in namespaces { _ = FinishedCommand.run(["ip", "netns", "del", namespace], timeout: 30) }
    }

    /// Runs `ip`; throws what it wrote when it fails.
    private static func ip(_ arguments: [String]) throws {
        let result = FinishedCommand.run(["ip"] + arguments, timeout: 30)
        guard result.succeeded else { throw NetworkHostsError("ip failed. " + result.summary) }
    }

    /// Runs `body` holding the lock of `/tmp/wormhole-network-hosts.lock`, which every process making hosts takes;
    /// gives up after 60 s.
    private static func withSetupLock<T>(_ body: () throws -> T) throws -> T {
        let path = "/tmp/wormhole-network-hosts.lock"
        let descriptor = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else {
            throw NetworkHostsError("open \(path) failed: \(String(cString: strerror(errno)))")
        }
        defer { Foundation.close(descriptor) }
        let deadline = Date().addingTimeInterval(60)
        while flock(descriptor, LOCK_EX | LOCK_NB) != 0 {
            guard Date() < deadline else { throw NetworkHostsError("\(path) stayed locked for 60 s.") }
            usleep(10_000)
        }
        return try body()
    }

    /// The first three octets of a /24 of 10.201.0.0/16–10.250.0.0/16 that no address or route of the root namespace
    /// overlaps, starting from the one `preferred` picks.
    private static func freeSubnet(preferring preferred: Int) throws -> String {
        let addresses = FinishedCommand.run(["ip", "-o", "-4", "address", "show"], timeout: 30)
        let routes = FinishedCommand.run(["ip", "-o", "-4", "route", "show", "table", "all"], timeout: 30)
        guard addresses.succeeded, routes.succeeded else {
            throw NetworkHostsError("ip could not list addresses and routes. " + addresses.summary + routes.summary)
        }
        // Every a.b.c.d/len in either listing: the addresses after `inet`, the routes' destinations first.
        let taken = (addresses.output + "\n" + routes.output).split(whereSeparator: \.isWhitespace)
            .compactMap { IPv4Prefix(String($0)) }
        let blocks = secondOctets * 256
        for offset in 0..<blocks {
            let block = ((preferred % blocks) + blocks + offset) % blocks
            let candidate = IPv4Prefix(
                address: UInt32(10 << 24 | (firstSecondOctet + block / 256) << 16 | (block % 256) << 8),
                length: 24
            )
            if !taken.contains(where: { $0.overlaps(candidate) }) {
                return "10.\(firstSecondOctet + block / 256).\(block % 256)"
            }
        }
        throw NetworkHostsError("Every /24 of 10.201.0.0/16–10.250.0.0/16 is in use.")
    }

    /// Deletes the pairs and namespaces of processes that are gone: pairs named `whr<pid in base 36>-…` and namespaces
    /// named `wh-<pid>-…`.
    private static func removeStaleHosts() {
        let links = FinishedCommand.run(["ip", "-o", "link", "show"], timeout: 30).output
        for line in links.split(separator: "\n") {
            // `7: whr1a2b-0-1@if6: <BROADCAST,…`: the name is the second field, before any `@`.
            let fields = line.split(separator: " ")
            guard fields.count > 1 else { continue }
            let name = fields[1].split(separator: "@").first.map { String($0.trimmingCharacters(in: [":"])) } ?? ""
            guard name.hasPrefix("whr"),
                let owner = name.dropFirst(3).split(separator: "-").first.flatMap({ Int32($0, radix: 36) }),
                !ProcessTable.isAlive(owner)
            else { continue }
            _ = FinishedCommand.run(["ip", "link", "del", name], timeout: 30)
        }
        let namespaces = FinishedCommand.run(["ip", "netns", "list"], timeout: 30).output
        for line in namespaces.split(separator: "\n") {
            // `wh-1234-0-1 (id: 3)`: the name is the first field.
            guard let name = line.split(separator: " ").first, name.hasPrefix("wh-") else { continue }
            let parts = name.split(separator: "-")
            guard parts.count > 2, let owner = Int32(parts[1]), !ProcessTable.isAlive(owner) else { continue }
            _ = FinishedCommand.run(["ip", "netns", "del", String(name)], timeout: 30)
        }
    }
}

/// An IPv4 prefix (`a.b.c.d/len`; a bare address is a /32), to tell whether a subnet overlaps the machine's.
private struct IPv4Prefix {
    /// The address, most significant octet first.
    let address: UInt32
    let length: Int

    init(address: UInt32, length: Int) {
        self.address = address
        self.length = length
    }

    /// Parses `a.b.c.d` or `a.b.c.d/len`; nil for anything else.
    init?(_ text: String) {
        let parts = text.split(separator: "/", omittingEmptySubsequences: false)
        let octets = parts[0].split(separator: ".", omittingEmptySubsequences: false).compactMap { UInt8($0) }
        guard parts.count <= 2, octets.count == 4 else { return nil }
        let length = parts.count == 2 ? Int(parts[1]) : 32
        guard let length, (0...32).contains(length) else { return nil }
        self.address = octets.reduce(0) { $0 << 8 | UInt32($1) }
        self.length = length
    }

    /// Whether the two share an address: one contains the other's network.
    func overlaps(_ other: IPv4Prefix) -> Bool {
        let shorter = min(length, other.length)
        let mask: UInt32 = shorter == 0 ? 0 : ~0 << (32 - shorter)
        return address & mask == other.address & mask
    }
}

/// Why network hosts could not be made or changed: the `ip` command that failed and what it wrote.
package struct NetworkHostsError: Error, CustomStringConvertible {
    /// What went wrong.
    package let message: String

    /// An error saying `message`.
    package init(_ message: String) { self.message = message }

    package var description: String { message }
}
