import Foundation
import Synchronization

/// A PostgreSQL server of its own in a temporary directory, for the tests, the tool's demo and the benchmarks: a
/// fresh cluster with a `wormhole` role and database, listening on the addresses asked for, removed by ``close()``.
///
/// It runs the machine's own PostgreSQL programs (`initdb`, `pg_ctl`, `postgres`, `psql`); the server refuses to run
/// as root, so under root they run as the `postgres` user. Unless `durable`, it trades durability for speed
/// (`fsync`, `synchronous_commit` and `full_page_writes` off): a crash of the machine may lose its data, which no test
/// needs. A server left behind by a process that died (killed, crashed) is removed by the next one made.
///
/// ```swift
/// let server = try LocalPostgresServer()
/// defer { server.close() }
/// let engine = try PostgresEngine(url: server.url, group: "group.example")
/// _ = try server.psql("SELECT count(*) FROM pg_stat_activity")
/// ```
package final class LocalPostgresServer: Sendable {
    /// How ``stop(mode:)`` shuts the server down: `pg_ctl stop -m`.
    package enum ShutdownMode: String, Sendable {
        /// Waits until every client has disconnected.
        case smart
        /// Disconnects the clients, then shuts down cleanly.
        case fast
        /// Stops every server process at once, as a crash would: the next start recovers from the write-ahead log.
        case immediate
    }

    /// The TCP port the server listens on.
    package let port: Int

    /// The first of the addresses the server listens on (the loopback address when it listens on every address).
    package let host: String

    /// The temporary directory holding the cluster (`data`), the log and the Unix socket.
    package let directory: String

    /// The server's log.
    package let logPath: String

    /// The server's self-signed certificate, for `localhost`, when it was made with `tls`: what a client trusts with
    /// `sslrootcert` to verify the server. Nil otherwise.
    package let certificatePath: String?

    /// With `tls`, a client certificate and its key (PEM files) for the role ``certifiedRole``, signed by the
    /// server's certificate, which the server trusts for clients: that role logs in over TCP with the certificate
    /// alone (`cert` in `pg_hba.conf`). Nil otherwise.
    package let clientCertificate: (certificate: String, key: String)?

    /// The role that logs in with ``clientCertificate``; the server has no such role until a test makes it.
    package static let certifiedRole = "wormhole_certified"

    /// The password of the `wormhole` role, if it has one.
    private let password: String?

    /// The programs that run the server, and as whom.
    private let tools: Tools

    /// What changes as the server stops and starts.
    private let state: Mutex<State>

    /// What changes as the server stops and starts.
    private struct State {
        /// The postmaster's process id, the last one when stopped.
        var processIdentifier: Int32
        var isRunning: Bool
        var isClosed = false
    }

    /// The prefix of the temporary directories of the servers, so that the servers of dead processes can be found.
    private static let directoryPrefix = "/tmp/wormhole-postgres-"

    /// How long one `initdb`, `pg_ctl` or `psql` may take: far more than they do, so that only a hang trips it.
    private static let commandTimeout: Double = 120

    /// Creates a cluster in a new temporary directory, starts its server and creates the `wormhole` role and database.
    ///
    /// - Parameters:
    ///   - listenAddresses: The addresses the server listens on (`listen_addresses`); the first is ``host``.
    ///   - port: The TCP port; a free one when nil.
    ///   - password: The `wormhole` role's password; when given, TCP clients must give it (SCRAM-SHA-256), when nil
    ///     every TCP client is trusted.
    ///   - durable: Whether the server syncs its writes to disk, as a production server does.
    ///   - tls: Whether TCP clients must use TLS: the server gets a self-signed certificate for `localhost`
    ///     (``certificatePath``, made with `openssl`) and refuses unencrypted TCP connections. The Unix socket, which
    ///     ``psql(_:database:user:)`` uses, stays unencrypted.
    /// - Throws: ``LocalPostgresServerError`` when PostgreSQL (or, with `tls`, openssl) is not installed or a step
    ///   fails; nothing is left behind.
    package init(
        listenAddresses: [String] = ["127.0.0.1"],
        port: Int? = nil,
        password: String? = nil,
        durable: Bool = false,
        tls: Bool = false
    ) throws {
        guard let first = listenAddresses.first else {
            throw LocalPostgresServerError("A local PostgreSQL server needs at least one address to listen on.")
        }
        Self.removeStaleServers()
        let tools = try Self.locateTools()
        var template = Array((Self.directoryPrefix + "XXXXXX").utf8CString)
        guard let created = mkdtemp(&template) else {
            throw LocalPostgresServerError("mkdtemp failed: \(String(cString: strerror(errno)))")
        }
        let directory = String(cString: created)
        self.directory = directory
        self.logPath = directory + "/server.log"
        self.certificatePath = tls ? directory + "/server.crt" : nil
        self.clientCertificate = tls ? (directory + "/client.crt", directory + "/client.key") : nil
        self.tools = tools
        self.password = password
        // A wildcard is no address to connect to: its clients use the loopback address of the same family.
        self.host = ["*", "0.0.0.0"].contains(first) ? "127.0.0.1" : first == "::" ? "::1" : first
        do {
            // First of all, so that a process that dies from here on leaves a directory the next sweep removes.
            try Data("\(getpid())\n".utf8).write(to: URL(fileURLWithPath: directory + "/owner.pid"))
            if let owner = tools.owner, chown(directory, owner.uid, owner.gid) != 0 {
                throw LocalPostgresServerError("chown \(directory) failed: \(String(cString: strerror(errno)))")
            }
            try Self.initializeCluster(in: directory, tools: tools)
            if tls { try Self.makeCertificate(in: directory, tools: tools) }
            try Self.configure(
                directory: directory,
                listenAddresses: listenAddresses,
                trusted: password == nil,
                durable: durable,
                tls: tls
            )
            self.port = try Self.start(directory: directory, tools: tools, port: port)
            self.state = Mutex(State(processIdentifier: try Self.postmasterIdentifier(in: directory), isRunning: true))
        } catch {
            Self.removeServer(in: directory)
            throw error
        }
        do {
            let passwordClause = password.map { " PASSWORD '\($0.replacingOccurrences(of: "'", with: "''"))'" } ?? ""
            try psql("CREATE ROLE wormhole LOGIN NOSUPERUSER CREATEROLE" + passwordClause, database: "postgres")
            // CREATE DATABASE cannot run in the transaction of a query of several statements: a call of its own.
            try psql("CREATE DATABASE wormhole OWNER wormhole", database: "postgres")
        } catch {
            close()
            throw error
        }
    }

    deinit { close() }

    /// The postmaster's process id; it changes when the server restarts.
    package var processIdentifier: Int32 { state.withLock { $0.processIdentifier } }

    /// The URL a client connects to the `wormhole` database with, as the `wormhole` role, at ``host``.
    package var url: String { url(host: host) }

    /// The URL of the same server seen at another of its addresses (one of a ``NetworkHosts``' server addresses).
    package func url(host: String) -> String {
        let credentials =
            password.map {
                "wormhole:" + ($0.addingPercentEncoding(withAllowedCharacters: .urlPasswordAllowed) ?? $0)
            } ?? "wormhole"
        let address = host.contains(":") ? "[\(host)]" : host
        return "postgres://\(credentials)@\(address):\(port)/wormhole?sslmode=disable"
    }

    /// Stops the server (`pg_ctl stop -m MODE -w`); when that fails, kills it. Returns when its processes are gone, or
    /// after 30 s. Does nothing when it is not running.
    package func stop(mode: ShutdownMode = .fast) {
        state.withLock { state in
            guard state.isRunning else { return }
            Self.stopServer(directory: directory, tools: tools, processIdentifier: state.processIdentifier, mode: mode)
            state.isRunning = false
        }
    }

    /// Starts the server again, on the same data and port. Does nothing when it is running.
    ///
    /// - Throws: ``LocalPostgresServerError`` when it does not start, with the end of its log.
    package func start() throws {
        try state.withLock { state in
            guard !state.isRunning else { return }
            guard !state.isClosed else { throw LocalPostgresServerError("The server was closed: it cannot start.") }
            try Self.startServer(directory: directory, tools: tools)
            state.processIdentifier = try Self.postmasterIdentifier(in: directory)
            state.isRunning = true
        }
    }

    /// Stops the server with `mode`, then starts it again.
    package func restart(mode: ShutdownMode = .fast) throws {
        stop(mode: mode)
        try start()
    }

    /// Runs SQL with `psql` over the Unix socket, and returns what it printed, unaligned and without headers
    /// (`SELECT 1` gives `1`; rows are lines, columns are separated by `|`), trimmed.
    ///
    /// - Parameters:
    ///   - database: The database to connect to.
    ///   - user: The role to connect as; the socket trusts every role.
    /// - Throws: ``LocalPostgresServerError`` with what `psql` wrote when it fails.
    @discardableResult
    package func psql(_ sql: String, database: String = "wormhole", user: String = "postgres") throws -> String {
        try psql(commands: [sql], database: database, user: user)
    }

    /// Runs each of `commands` with `psql`, as ``psql(_:database:user:)`` does, one after the other in one session,
    /// each its own transaction: a `LISTEN` in one takes effect before the next runs, and what it hears is printed
    /// (`Asynchronous notification "CHANNEL" with payload "…" received from server process with PID N.`).
    @discardableResult
    package func psql(commands: [String], database: String = "wormhole", user: String = "postgres") throws -> String {
        let arguments =
            [
                "-h", directory, "-p", "\(port)", "-U", user, "-d", database, "-X", "-q", "-A", "-t",
                "-v", "ON_ERROR_STOP=1",
            ] + commands.flatMap { ["-c", $0] }
        let result = FinishedCommand.run(
            tools.prefix + [tools.psql] + arguments,
            timeout: Self.commandTimeout,
            directory: directory
        )
        guard result.succeeded else { throw LocalPostgresServerError("psql failed. " + result.summary) }
        return result.output.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Stops the server at once if it runs and removes its directory. Calling it again does nothing.
    package func close() {
        state.withLock { state in
            guard !state.isClosed else { return }
            if state.isRunning {
                Self.stopServer(
                    directory: directory,
                    tools: tools,
                    processIdentifier: state.processIdentifier,
                    mode: .immediate
                )
                state.isRunning = false
            }
            Self.removeServer(in: directory)
            state.isClosed = true
        }
    }

    /// Why no server can be made on this machine, saying what to install; nil when one can.
    package static func unavailableReason() -> String? {
        do {
            _ = try locateTools()
            return nil
        } catch {
            return error.message
        }
    }
}

// MARK: - Steps

extension LocalPostgresServer {
    /// The programs that run the server, and as whom.
    private struct Tools: Sendable {
        var initdb: String
        var pgCtl: String
        var psql: String
        /// What runs a program as the `postgres` user, under root; nothing otherwise.
        var prefix: [String]
        /// The `postgres` user, who owns the directory, under root.
        var owner: (uid: uid_t, gid: gid_t)?
    }

    /// Finds `initdb`, `pg_ctl`, `postgres` and `psql` on PATH or in `/usr/lib/postgresql/VERSION/bin`, the newest
    /// version first, and the `postgres` user under root.
    private static func locateTools() throws(LocalPostgresServerError) -> Tools {
        let fileManager = FileManager.default
        let path = ProcessInfo.processInfo.environment["PATH"] ?? ""
        let versions = ((try? fileManager.contentsOfDirectory(atPath: "/usr/lib/postgresql")) ?? [])
            .compactMap { name in Double(name).map { (version: $0, directory: "/usr/lib/postgresql/\(name)/bin") } }
            .sorted { $0.version > $1.version }
        let candidates = path.split(separator: ":").map(String.init) + versions.map(\.directory)
        func isExecutable(_ directory: String, _ name: String) -> Bool {
            fileManager.isExecutableFile(atPath: directory + "/" + name)
        }
        var found: String?
        for candidate in candidates where isExecutable(candidate, "initdb") {
            // /usr/local/bin may hold links to the programs: pg_ctl finds `postgres` beside its real path.
            let real = URL(fileURLWithPath: candidate + "/initdb").resolvingSymlinksInPath().deletingLastPathComponent()
            found = [real.path, candidate].first { directory in
                ["initdb", "pg_ctl", "postgres"].allSatisfy { isExecutable(directory, $0) }
            }
            if found != nil { break }
        }
        guard let directory = found else {
            throw LocalPostgresServerError(
                "PostgreSQL's server programs (initdb, pg_ctl, postgres) are not on PATH nor in "
                    + "/usr/lib/postgresql/*/bin: install PostgreSQL (apt-get install postgresql)."
            )
        }
        let psql =
            isExecutable(directory, "psql") ? directory + "/psql" : FinishedCommand.executablePath(named: "psql")
        guard let psql else {
            throw LocalPostgresServerError(
                "psql is not beside \(directory)/initdb nor on PATH: install PostgreSQL's client "
                    + "(apt-get install postgresql)."
            )
        }
        var tools = Tools(initdb: directory + "/initdb", pgCtl: directory + "/pg_ctl", psql: psql, prefix: [])
        guard getuid() == 0 else { return tools }
        // The server refuses to run as root: its programs run as the `postgres` user the package creates.
        guard let user = getpwnam("postgres") else {
            throw LocalPostgresServerError(
                "PostgreSQL refuses to run as root, and there is no `postgres` user to run it as: install PostgreSQL "
                    + "(apt-get install postgresql), which creates that user."
            )
        }
        guard let runuser = FinishedCommand.executablePath(named: "runuser") else {
            throw LocalPostgresServerError(
                "PostgreSQL refuses to run as root, and runuser, to run it as `postgres`, is not on PATH: install "
                    + "util-linux (apt-get install util-linux)."
            )
        }
        tools.prefix = [runuser, "-u", "postgres", "--"]
        tools.owner = (user.pointee.pw_uid, user.pointee.pw_gid)
        return tools
    }

    /// Runs `initdb`, quietly: its output only goes into the error when it fails.
    private static func initializeCluster(in directory: String, tools: Tools) throws {
        // The C locale, so that a locale of the environment that is not installed cannot fail the cluster.
        let arguments = [
            "-D", directory + "/data", "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync",
        ]
        let result = FinishedCommand.run(
            tools.prefix + [tools.initdb] + arguments,
            timeout: commandTimeout,
            directory: directory
        )
        guard result.succeeded else { throw LocalPostgresServerError("initdb failed. " + result.summary) }
    }

    /// Makes a self-signed certificate for `localhost` and its key, `server.crt` and `server.key` in `directory`, owned
    /// by the user who runs the server, the key readable by that user alone (the server refuses it otherwise).
    private static func makeCertificate(in directory: String, tools: Tools) throws {
        guard let openssl = FinishedCommand.executablePath(named: "openssl") else {
            throw LocalPostgresServerError(
                "openssl, to make the TLS server's certificate, is not on PATH: install it (apt-get install openssl)."
            )
        }
        let arguments = [
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
            "-keyout", directory + "/server.key", "-out", directory + "/server.crt",
        ]
        let result = FinishedCommand.run(
            tools.prefix + [openssl] + arguments,
            timeout: commandTimeout,
            directory: directory
        )
        guard result.succeeded else { throw LocalPostgresServerError("openssl failed. " + result.summary) }
        guard chmod(directory + "/server.key", 0o600) == 0 else {
            throw LocalPostgresServerError("chmod \(directory)/server.key failed: \(String(cString: strerror(errno)))")
        }
        // The client's: a request, then the certificate signed with the server's key (the server's certificate is
        // its own authority, and the one `ssl_ca_file` names).
        for arguments in [
            [
                "req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=\(certifiedRole)",
                "-keyout", directory + "/client.key", "-out", directory + "/client.csr",
            ],
            [
                "x509", "-req", "-in", directory + "/client.csr", "-CA", directory + "/server.crt",
                "-CAkey", directory + "/server.key", "-CAcreateserial", "-days", "2", "-out", directory + "/client.crt",
            ],
        ] {
            let result = FinishedCommand.run(
                tools.prefix + [openssl] + arguments,
                timeout: commandTimeout,
                directory: directory
            )
            guard result.succeeded else { throw LocalPostgresServerError("openssl failed. " + result.summary) }
        }
    }

    /// Adds the settings to `postgresql.conf` (later lines win) and replaces `pg_hba.conf`; with `tls`, TCP clients
    /// must use TLS (`hostssl` lines only), with the certificate `makeCertificate` made.
    private static func configure(
        directory: String,
        listenAddresses: [String],
        trusted: Bool,
        durable: Bool,
        tls: Bool
    ) throws {
        var settings = """

            # LocalPostgresServer
            listen_addresses = '\(listenAddresses.joined(separator: ","))'
            unix_socket_directories = '\(directory)'
            max_connections = 300

            """
        if !durable { settings += "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n" }
        if tls {
            settings += """
                ssl = on
                ssl_cert_file = '\(directory)/server.crt'
                ssl_key_file = '\(directory)/server.key'
                ssl_ca_file = '\(directory)/server.crt'

                """
        }
        try append(settings, to: directory + "/data/postgresql.conf")
        let method = trusted ? "trust" : "scram-sha-256"
        // `hostssl` lines match TLS connections only: with no `host` line, the server refuses the others.
        let kind = tls ? "hostssl" : "host"
        // With TLS, the certified role logs in with its client certificate alone.
        let certified = tls ? "hostssl all \(certifiedRole) 0.0.0.0/0 cert\n" : ""
        let access = """
            local all all trust
            \(certified)\(kind) all all 0.0.0.0/0 \(method)
            \(kind) all all ::/0 \(method)

            """
        // Rewritten in place, so that the file keeps its owner, the `postgres` user.
        let handle = try FileHandle(forUpdating: URL(fileURLWithPath: directory + "/data/pg_hba.conf"))
        defer { try? handle.close() }
        try handle.truncate(atOffset: 0)
        try handle.write(contentsOf: Data(access.utf8))
    }

    /// Appends text to a file, which keeps its owner.
    private static func append(_ text: String, to path: String) throws {
        let handle = try FileHandle(forUpdating: URL(fileURLWithPath: path))
        defer { try? handle.close() }
        try handle.seekToEnd()
        try handle.write(contentsOf: Data(text.utf8))
    }

    /// `pg_ctl start`, waiting until the server accepts connections (60 s at most).
    private static func startServer(directory: String, tools: Tools) throws {
        let arguments = ["-D", directory + "/data", "-l", directory + "/server.log", "-w", "-t", "60", "start"]
        let result = FinishedCommand.run(
            tools.prefix + [tools.pgCtl] + arguments,
            timeout: commandTimeout,
            directory: directory
        )
        guard result.succeeded else {
            throw LocalPostgresServerError(
                "pg_ctl start failed. \(result.summary)\nThe end of the server's log:\n"
                    + logTail(directory + "/server.log")
            )
        }
    }

    /// Sets the port and starts the server for the first time; returns the port. A free port may be taken by someone
    /// else before the server binds it: then it tries another one, three times in all.
    private static func start(directory: String, tools: Tools, port: Int?) throws -> Int {
        var attempt = 1
        while true {
            let chosen = try port ?? freePort()
            try append("port = \(chosen)\n", to: directory + "/data/postgresql.conf")
            do {
                try startServer(directory: directory, tools: tools)
                return chosen
            } catch {
                let busy = logTail(directory + "/server.log").contains("Address already in use")
                guard port == nil, attempt < 3, busy else { throw error }
                attempt += 1
            }
        }
    }

    /// `pg_ctl stop`; SIGKILL to the postmaster and its children when that fails. Then waits until the postmaster is
    /// gone, 30 s at most.
    private static func stopServer(directory: String, tools: Tools, processIdentifier: Int32, mode: ShutdownMode) {
        let arguments = ["-D", directory + "/data", "-m", mode.rawValue, "-w", "-t", "60", "stop"]
        let result = FinishedCommand.run(
            tools.prefix + [tools.pgCtl] + arguments,
            timeout: commandTimeout,
            directory: directory
        )
        if !result.succeeded { ProcessTable.kill(processIdentifier, withChildren: true) }
        ProcessTable.waitUntilGone(processIdentifier, timeout: 30)
    }

    /// The postmaster's process id: the first line of `data/postmaster.pid`.
    private static func postmasterIdentifier(in directory: String) throws -> Int32 {
        let path = directory + "/data/postmaster.pid"
        guard let text = FileManager.default.contents(atPath: path).map({ String(decoding: $0, as: UTF8.self) }),
            let line = text.split(separator: "\n").first,
            let identifier = Int32(line.trimmingCharacters(in: .whitespaces))
        else { throw LocalPostgresServerError("\(path) does not name the server's process.") }
        return identifier
    }

    /// The last lines of the server's log, for errors.
    private static func logTail(_ path: String) -> String {
        guard let data = FileManager.default.contents(atPath: path) else { return "(no log)" }
        return String(decoding: data, as: UTF8.self).split(separator: "\n").suffix(20).joined(separator: "\n")
    }

    /// A TCP port free at this moment: the kernel picks one for a socket bound to 127.0.0.1:0, then it is closed.
    private static func freePort() throws -> Int {
        let socketDescriptor = socket(AF_INET, streamSocketType, 0)
        guard socketDescriptor >= 0 else {
            throw LocalPostgresServerError("socket failed: \(String(cString: strerror(errno)))")
        }
        defer { Foundation.close(socketDescriptor) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr = in_addr(s_addr: UInt32(0x7f00_0001).bigEndian)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { generic in
                bind(socketDescriptor, generic, length) == 0 && getsockname(socketDescriptor, generic, &length) == 0
            }
        }
        guard bound else { throw LocalPostgresServerError("no free TCP port: \(String(cString: strerror(errno)))") }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    /// Kills the server in `directory` if it still runs (its postmaster, named in `data/postmaster.pid`, only if that
    /// process is `postgres`), then removes the directory.
    private static func removeServer(in directory: String) {
        if let identifier = try? postmasterIdentifier(in: directory), ProcessTable.name(of: identifier) == "postgres" {
            ProcessTable.kill(identifier, withChildren: true)
            ProcessTable.waitUntilGone(identifier, timeout: 5)
        }
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Removes the servers of processes that died without closing them: every directory whose `owner.pid` names a
    /// process that is gone.
    private static func removeStaleServers() {
        let parent = URL(fileURLWithPath: directoryPrefix).deletingLastPathComponent().path
        let prefix = URL(fileURLWithPath: directoryPrefix).lastPathComponent
        let names = (try? FileManager.default.contentsOfDirectory(atPath: parent)) ?? []
        for name in names where name.hasPrefix(prefix) {
            let directory = parent + "/" + name
            // No owner yet: a server being made this very moment.
            guard let data = FileManager.default.contents(atPath: directory + "/owner.pid") else { continue }
            let owner = Int32(String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
            guard let owner, !ProcessTable.isAlive(owner) else { continue }
            removeServer(in: directory)
        }
    }
}

/// Why a local PostgreSQL server could not be made or used: the command that failed, what it wrote, and the end of the
/// server's log when it is about the server.
package struct LocalPostgresServerError: Error, CustomStringConvertible {
    /// What went wrong.
    package let message: String

    /// An error saying `message`.
    package init(_ message: String) { self.message = message }

    package var description: String { message }
}

// MARK: - Commands and processes, shared with NetworkHosts

/// A command run to its end with a time limit, and what it wrote: how the local server and the network hosts run
/// `initdb`, `pg_ctl`, `psql` and `ip`.
///
/// Its output goes to unlinked temporary files rather than pipes, so that no pipe fills up and a daemon it leaves
/// behind cannot hold the wait.
struct FinishedCommand: Sendable {
    /// The command line.
    let arguments: [String]

    /// Its exit status: -1 when it could not start or was killed at its time limit.
    let status: Int32

    /// Its standard output.
    let output: String

    /// Its standard error, or why it could not start or was killed.
    let errorOutput: String

    /// Whether it exited with status 0.
    var succeeded: Bool { status == 0 }

    /// The command line, its status and what it wrote, for an error's message.
    var summary: String {
        let written = (output + errorOutput).trimmingCharacters(in: .whitespacesAndNewlines)
        return "`\(arguments.joined(separator: " "))` exited with status \(status)"
            + (written.isEmpty ? "." : ":\n" + written)
    }

    /// Runs a command (a path, or a name looked up on PATH and the usual system directories), with no input and
    /// without the `PG…` variables of the environment, which would override the server's settings. Waits `timeout`
    /// seconds at most; then sends it SIGTERM, and SIGKILL 2 s later.
    ///
    /// - Parameters:
    ///   - directory: Its working directory; this process's when nil.
    static func run(_ arguments: [String], timeout: Double, directory: String? = nil) -> FinishedCommand {
        func failed(_ reason: String) -> FinishedCommand {
            FinishedCommand(arguments: arguments, status: -1, output: "", errorOutput: reason)
        }
        guard let name = arguments.first, let executable = executablePath(named: name) else {
            return failed("\(arguments.first ?? "(no command)") was not found on PATH.")
        }
        guard let output = TemporaryOutput(), let errorOutput = TemporaryOutput() else {
            return failed("no temporary file for its output: \(String(cString: strerror(errno)))")
        }
        let environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("PG") }
        var identifier: pid_t = 0
        let code = spawn(
            executable,
            arguments: arguments,
            environment: environment.map { "\($0.key)=\($0.value)" },
            directory: directory,
            output: output.descriptor,
            errorOutput: errorOutput.descriptor,
            identifier: &identifier
        )
        guard code == 0 else { return failed("it could not start: \(String(cString: strerror(code)))") }
        var note = ""
        var waitStatus = wait(for: identifier, until: Date().addingTimeInterval(timeout))
        if waitStatus == nil {
            note = "\nKilled after \(timeout) s."
            kill(identifier, SIGTERM)
            waitStatus = wait(for: identifier, until: Date().addingTimeInterval(2))
            if waitStatus == nil {
                kill(identifier, SIGKILL)
                waitStatus = wait(for: identifier, until: Date().addingTimeInterval(10))
            }
        }
        // The exit code in bits 8–15 when the low 7 bits (the signal) are 0; a shell's 128 + signal otherwise.
        var status: Int32 = -1
        if let waitStatus, note.isEmpty {
            status = waitStatus & 0x7f == 0 ? (waitStatus >> 8) & 0xff : 128 + waitStatus & 0x7f
        }
        return FinishedCommand(
            arguments: arguments,
            status: status,
            output: output.contents(),
            errorOutput: errorOutput.contents() + note
        )
    }

    /// Starts a program with `posix_spawn`, its input `/dev/null`, its output and error output the descriptors given,
    /// and no other descriptor of this process: a daemon it leaves behind (`pg_ctl start`'s postmaster) must hold
    /// nothing of ours. (Foundation's `Process` lets its children inherit the socket it watches them with, so that
    /// it sees no exit while such a daemon lives.) Sets `identifier` to the child's process id; returns 0 or the
    /// error number.
    private static func spawn(
        _ executable: String,
        arguments: [String],
        environment: [String],
        directory: String?,
        output: Int32,
        errorOutput: Int32,
        identifier: inout pid_t
    ) -> Int32 {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, output, 1)
        posix_spawn_file_actions_adddup2(&actions, errorOutput, 2)
        // Both are glibc's (2.34 and 2.29) but Glibc's module does not declare them: found at run time.
        let library = dlopen(nil, RTLD_NOW)
        defer { if let library { dlclose(library) } }
        typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>?, Int32) -> Int32
        typealias ChangeDirectory =
            @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>?, UnsafePointer<CChar>?) -> Int32
        if let symbol = dlsym(library, "posix_spawn_file_actions_addclosefrom_np") {
            _ = unsafeBitCast(symbol, to: CloseFrom.self)(&actions, 3)
        }
        if let directory, let symbol = dlsym(library, "posix_spawn_file_actions_addchdir_np") {
            _ = directory.withCString { unsafeBitCast(symbol, to: ChangeDirectory.self)(&actions, $0) }
        }
        // Signals as a fresh process has them: none blocked, none ignored (this process ignores SIGPIPE).
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var signals = sigset_t()
        sigemptyset(&signals)
        posix_spawnattr_setsigmask(&attributes, &signals)
        sigfillset(&signals)
        posix_spawnattr_setsigdefault(&attributes, &signals)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        let argv = arguments.map { strdup($0) } + [nil]
        let envp = environment.map { strdup($0) } + [nil]
        defer { for pointer in argv + envp { free(pointer) } }
        return posix_spawn(&identifier, executable, &actions, &attributes, argv, envp)
    }

    /// Waits for a child to exit, until `deadline`; returns its wait status, nil if it still runs.
    private static func wait(for identifier: pid_t, until deadline: Date) -> Int32? {
        var status: Int32 = 0
        while true {
            let result = waitpid(identifier, &status, WNOHANG)
            if result == identifier { return status }
            if result < 0 && errno != EINTR { return -1 }
            if Date() >= deadline { return nil }
            usleep(2_000)
        }
    }

    /// The path of a program: `name` itself when it holds a `/`, else the first executable of that name on PATH or in
    /// the usual system directories (`ip` and `runuser` live in `/usr/sbin`, which a user's PATH may lack).
    static func executablePath(named name: String) -> String? {
        if name.contains("/") { return FileManager.default.isExecutableFile(atPath: name) ? name : nil }
        let path = (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":").map(String.init)
        let system = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        return (path + system).lazy.map { $0 + "/" + name }.first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// An unlinked temporary file that a command writes to and that is read once it exits.
    private struct TemporaryOutput {
        /// The file, read afterwards.
        let reader: FileHandle

        /// The file's descriptor, which the command's output becomes.
        var descriptor: Int32 { reader.fileDescriptor }

        init?() {
            var template = Array("/tmp/wormhole-command-XXXXXX".utf8CString)
            let descriptor = mkstemp(&template)
            guard descriptor >= 0 else { return nil }
            unlink(template)
            // Not for the children that other threads start: `spawn` gives it to the command alone.
            _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC)
            reader = FileHandle(fileDescriptor: descriptor, closeOnDealloc: true)
        }

        /// Everything written to the file.
        func contents() -> String {
            try? reader.seek(toOffset: 0)
            return String(decoding: (try? reader.readToEnd()) ?? Data(), as: UTF8.self)
        }
    }
}

/// What `/proc` and `kill` tell of other processes: whether they live, their names and children.
enum ProcessTable {
    /// Whether a process exists and is not a zombie (a zombie is gone as far as its resources go).
    static func isAlive(_ identifier: Int32) -> Bool {
        guard identifier > 0, Foundation.kill(identifier, 0) == 0 || errno == EPERM else { return false }
        return status(of: identifier)?.state != "Z"
    }

    /// A process's name (`/proc/PID/comm`), nil when it is gone.
    static func name(of identifier: Int32) -> String? {
        #if os(Linux) || os(Android)
        FileManager.default.contents(atPath: "/proc/\(identifier)/comm").map {
            String(decoding: $0, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        }
        #else
        nil  // no /proc: the caller names the process by its id alone
        #endif
    }

    /// Sends SIGKILL to a process and, when asked, to its children first found (a postmaster's backends, which
    /// would otherwise hold its shared memory a little longer).
    static func kill(_ identifier: Int32, withChildren: Bool) {
        let children = withChildren ? self.children(of: identifier) : []
        Foundation.kill(identifier, SIGKILL)
        for child in children { Foundation.kill(child, SIGKILL) }
    }

    /// Waits until a process is gone, `timeout` seconds at most; returns whether it is.
    @discardableResult
    static func waitUntilGone(_ identifier: Int32, timeout: Double) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while isAlive(identifier) {
            if Date() >= deadline { return false }
            usleep(10_000)
        }
        return true
    }

    /// The processes whose parent is `identifier`.
    private static func children(of identifier: Int32) -> [Int32] {
        #if !(os(Linux) || os(Android))
        // No /proc: the children are left to their parent's exit.
        return []
        #else
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.compactMap { Int32($0) }.filter { status(of: $0)?.parent == identifier }
        #endif
    }

    /// A process's state letter and parent, from `/proc/PID/stat` (after its name, which may hold spaces).
    private static func status(of identifier: Int32) -> (state: Character, parent: Int32)? {
        #if !(os(Linux) || os(Android))
        // No /proc: a process that `kill(pid, 0)` finds counts as alive, zombie or not.
        return nil
        #else
        guard let data = FileManager.default.contents(atPath: "/proc/\(identifier)/stat") else { return nil }
        let text = String(decoding: data, as: UTF8.self)
        guard let end = text.lastIndex(of: ")") else { return nil }
        let fields = text[text.index(after: end)...].split(separator: " ")
        guard fields.count > 1, let state = fields[0].first, let parent = Int32(fields[1]) else { return nil }
        return (state, parent)
        #endif
    }
}

/// `SOCK_STREAM` as `socket(2)` takes it: Glibc imports the socket types as an enum, Darwin as plain `Int32`
/// (`#define SOCK_STREAM 1`, xnu's `bsd/sys/socket.h`).
package var streamSocketType: Int32 {
    #if canImport(Glibc)
    Int32(SOCK_STREAM.rawValue)
    #else
    SOCK_STREAM
    #endif
}
