import Foundation
import Logging
import Testing
import WormholeCLI
import WormholeKit
import WormholePostgres

/// What the PostgreSQL engine promises about security, on a real server: a role sees and changes only the groups
/// granted to it, text that looks like SQL is stored as text, a password never reaches a description, an error, a
/// log line or the tool's output, and `sslmode` means what libpq means by it.
@Suite(
    "PostgreSQL engine: group isolation, SQL injection, passwords and TLS",
    .slow("needs a PostgreSQL server (and some, network namespaces)"),
    .serialized,
    .timeLimit(.minutes(3))
)
struct PostgresSecurityTests {
    /// Text that ends a quoted SQL string and drops a table, were it ever pasted into a statement.
    static let injection = "'); DROP TABLE wormhole.mailboxes; --"

    // MARK: Group isolation

    @Test("A role uses only the groups granted to it: another group's rows, channel and writes stay out of reach")
    func groupIsolation() async throws { try await offThePool { try groupIsolationBody() } }

    func groupIsolationBody() throws {
        let server = try requireTestServer()
        let roles = try GrantedRoles(server, prefix: "isolation")
        defer { roles.close() }
        let (one, two, groupA, groupB) = (roles.one, roles.two, roles.groupA, roles.groupB)

        // Role one writes every kind of row in group A.
        let engineA = try PostgresEngine(url: Self.url(server, user: one), group: groupA, setsUpSchema: false)
        defer { engineA.close() }
        let wormholeA = Wormhole(engine: engineA, sender: "role-one")
        try wormholeA.passMessageObject("secret of A", identifier: "box")
        try wormholeA.queue("jobs").enqueue("job of A")
        try wormholeA.suite("settings").set("value of A", forKey: "key")
        #expect(try wormholeA.message(withIdentifier: "box", as: String.self) == "secret of A")
        #expect(try wormholeA.queue("jobs").log.openCursor(consumer: "reader").read(maximumCount: 10).count == 1)
        #expect(try wormholeA.suite("settings").value(forKey: "key", as: String.self) == "value of A")

        // Role two may not open group A: the server refuses it (row-level security on wormhole.groups).
        let refused = wormholeError {
            _ = try PostgresEngine(url: Self.url(server, user: two), group: groupA, setsUpSchema: false)
        }
        #expect(refused?.code == .serverRejected, "\(String(describing: refused))")
        #expect(refused?.message.contains("42501") == true, "\(String(describing: refused))")

        // Role two, on its own group B, sees nothing of A's.
        let engineB = try PostgresEngine(url: Self.url(server, user: two), group: groupB, setsUpSchema: false)
        defer { engineB.close() }
        let wormholeB = Wormhole(engine: engineB, sender: "role-two")
        #expect(try wormholeB.messageData(withIdentifier: "box") == nil)
        #expect(try wormholeB.identifiers().isEmpty)
        #expect(try wormholeB.queue("jobs").log.openCursor(consumer: "reader").read(maximumCount: 10).isEmpty)
        #expect(try wormholeB.queue("jobs").status().endOffset == 0)
        #expect(try wormholeB.suite("settings").value(forKey: "key", as: String.self) == nil)

        // In SQL, as role two: no row of A in any table, nor A's channel, while role one sees its rows.
        for table in ["mailboxes", "queues", "queue_records", "suites", "suite_values", "suite_changes"] {
            let count = "SELECT count(*) FROM wormhole.\(table) WHERE grp = '\(groupA)'"
            #expect(try server.psql(count, user: two) == "0", "role two sees rows of A in \(table)")
            #expect(try server.psql(count, user: one) != "0", "role one does not see its rows in \(table)")
        }
        #expect(try server.psql("SELECT count(*) FROM wormhole.mailboxes", user: two) == "0")
        let channelA = try server.psql("SELECT channel FROM wormhole.groups WHERE grp = '\(groupA)'")
        #expect(channelA.hasPrefix("wormhole_"))
        let groupsOfTwo = try server.psql("SELECT grp || ' ' || channel FROM wormhole.groups", user: two)
        #expect(!groupsOfTwo.contains(channelA), "role two reads the channel of A")
        #expect(!groupsOfTwo.contains(groupA))
        #expect(groupsOfTwo.contains(groupB))
        #expect(try server.psql("SELECT channel FROM wormhole.groups WHERE grp = '\(groupA)'", user: one) == channelA)
        // Of the grants, a role sees its own only: not who may use A.
        #expect(try server.psql("SELECT count(*) FROM wormhole.group_roles WHERE grp = '\(groupA)'", user: two) == "0")
        #expect(try server.psql("SELECT count(*) FROM wormhole.group_roles", user: two) == "1")

        // Nor can it change A: an update finds no row, an insert into A is refused.
        let update = "UPDATE wormhole.mailboxes SET payload = NULL WHERE grp = '\(groupA)' RETURNING identifier"
        #expect(try server.psql(update, user: two) == "")
        #expect(throws: LocalPostgresServerError.self, "role two wrote into group A") {
            try server.psql(
                """
                INSERT INTO wormhole.mailboxes (grp, identifier, sequence, sender, time_ns, payload)
                VALUES ('\(groupA)', 'forged', 1, 'role-two', 0, 'x')
                """,
                user: two
            )
        }
        #expect(try wormholeA.message(withIdentifier: "box", as: String.self) == "secret of A")
        #expect(try wormholeA.identifiers() == ["box"])
    }

    @Test(
        "A live listener of a role that lost a grant gets the server's refusal at once, not a registration left pending"
    )
    func liveListenerRefusedAtOnce() async throws { try await offThePool { try liveListenerRefusedAtOnceBody() } }

    func liveListenerRefusedAtOnceBody() throws {
        let server = try requireTestServer()
        let roles = try GrantedRoles(server, prefix: "refused")
        defer { roles.close() }
        let engine = try PostgresEngine(
            url: Self.url(server, user: roles.one),
            group: roles.groupA,
            setsUpSchema: false
        )
        defer { engine.close() }
        // The listening connection's first statements on the endpoints' table (sweeping those of processes gone)
        // are refused from now on: waiting for the server would not mend that.
        try server.psql(
            "SELECT pg_advisory_xact_lock(8606223227157441637); REVOKE DELETE ON wormhole.live_endpoints FROM \(roles.one)"
        )
        let started = ContinuousClock.now
        let refused = wormholeError {
            _ = try Wormhole(engine: engine, sender: "one").listenForLiveMessageData(withIdentifier: "ticks") { _ in }
        }
        let waited = ContinuousClock.now - started
        #expect(refused?.code == .serverRejected, "\(String(describing: refused))")
        #expect(refused?.message.contains("42501") == true, "\(String(describing: refused))")
        // One attempt to listen, where it waited 10 s before saying the server was not reachable.
        #expect(waited < .seconds(5), "registering took \(waited)")
    }

    @Test("A store's history is the group's: a granted role writes and reads it, another group's role sees none of it")
    func storeIsolation() async throws { try await offThePool { try storeIsolationBody() } }

    func storeIsolationBody() throws {
        let server = try requireTestServer()
        let roles = try GrantedRoles(server, prefix: "store")
        defer { roles.close() }
        let (one, two, groupA) = (roles.one, roles.two, roles.groupA)
        // Role one may make the schema of its store's tables: it owns them, as an application's role would.
        let schema = "secure_" + String(UInt32.random(in: 0...UInt32.max))
        try server.psql("CREATE SCHEMA \(schema) AUTHORIZATION \(one)")

        // Role one, granted A but owning none of the engine's tables: every statement of the store passes the
        // policies, the triggers' included.
        let engineA = try PostgresEngine(url: Self.url(server, user: one), group: groupA, setsUpSchema: false)
        defer { engineA.close() }
        let store = try PostgresStore(
            engine: engineA,
            name: "secrets",
            schema: schema,
            migrations: [.init("v1", sql: "CREATE TABLE secret (id bigint PRIMARY KEY, body text NOT NULL)")],
            configuration: .init(author: "role-one")
        )
        // A durable consumer's row, registered before the write (which it has then not merged, so nothing is purged).
        try store.observeRemoteChanges(consumer: "reader") { _ in }.cancel()
        try store.write { db in try db.query("INSERT INTO secret (id, body) VALUES (1, \(Self.injection))") }
        let history = try store.transactions(after: 0)
        #expect(history.map(\.author) == ["role-one"])
        #expect(
            try store.read { db in try db.query("SELECT body FROM secret")[0].decode(String.self) } == Self.injection
        )

        // Role two sees no row of A's store in any store table, and cannot open a store of A.
        for table in ["stores", "store_transactions", "store_changes", "store_consumers", "store_migrations"] {
            let count = "SELECT count(*) FROM wormhole.\(table) WHERE grp = '\(groupA)'"
            #expect(try server.psql(count, user: two) == "0", "role two sees rows of A in \(table)")
            #expect(try server.psql(count, user: one) != "0", "role one does not see its rows in \(table)")
        }
        #expect(throws: (any Error).self) {
            _ = try PostgresEngine(url: Self.url(server, user: two), group: groupA, setsUpSchema: false)
        }
        // Nor can it write A's history directly: the policies check what it inserts.
        #expect(throws: (any Error).self) {
            try server.psql(
                "INSERT INTO wormhole.store_transactions (grp, store, id, xid, author, committed) "
                    + "VALUES ('\(groupA)', 'secrets', 99, pg_current_xact_id(), 'forged', now())",
                user: two
            )
        }
    }

    // MARK: SQL injection

    @Test("Text that looks like SQL round-trips unchanged in payloads, senders, suite keys and values")
    func injectionIsText() async throws { try await offThePool { try injectionIsTextBody() } }

    func injectionIsTextBody() throws {
        let server = try requireTestServer()
        let attack = Self.injection
        let group = uniqueGroup("injection")
        let writerEngine = try PostgresEngine(url: server.url, group: group)
        defer { writerEngine.close() }
        let readerEngine = try PostgresEngine(url: server.url, group: group)
        defer { readerEngine.close() }
        let writer = Wormhole(engine: writerEngine, sender: "writer" + attack)
        let reader = Wormhole(engine: readerEngine, sender: "reader")

        // Identifiers and groups are validated (MessageIdentifier and the group's rules): what they refuse is
        // refused before any statement. Quotes and semicolons are valid identifiers, bound as parameters below.
        let slashed = "x/" + attack
        #expect(wormholeError { try writer.passMessageObject("x", identifier: slashed) }?.code == .invalidIdentifier)
        #expect(wormholeError { _ = try writer.queue(slashed) }?.code == .invalidIdentifier)
        #expect(wormholeError { _ = try writer.suite(slashed) }?.code == .invalidIdentifier)
        #expect(
            wormholeError { _ = try PostgresEngine(url: server.url, group: "g" + attack) }?.code == .invalidIdentifier
        )

        // Payloads, senders and identifiers are bound parameters: they come back byte for byte, and the
        // notification naming the identifier reaches its listener.
        let heard = Collector<String>()
        let listener = try reader.listenForMessage(withIdentifier: attack, as: String.self) { heard.append($0) }
        defer { listener.cancel() }
        try writer.passMessageObject(attack, identifier: attack)
        #expect(eventually { heard.values == [attack] })
        try writer.passMessageData(Data(attack.utf8), identifier: "raw")
        let envelope = try #require(try reader.envelope(withIdentifier: attack))
        #expect(envelope.sender == "writer" + attack)
        #expect(try reader.message(withIdentifier: attack, as: String.self) == attack)
        #expect(try reader.messageData(withIdentifier: "raw") == Data(attack.utf8))
        #expect(try reader.identifiers().sorted() == [attack, "raw"].sorted())

        try writer.queue(attack).enqueueData(Data(attack.utf8))
        let records = try reader.queue(attack).log.openCursor(consumer: attack).read(maximumCount: 10)
        #expect(records.map(\.payload) == [Data(attack.utf8)])
        #expect(records.map(\.sender) == ["writer" + attack])

        // Suite names, keys, values and directions are text too.
        try writer.suite(attack).set(attack, forKey: attack, direction: attack)
        #expect(try reader.suite(attack).value(forKey: attack, as: String.self) == attack)
        #expect(try reader.suite(attack).snapshot()[attack, as: String.self] == attack)
        let change = try reader.suite(attack).store.changes(after: 0).changes?.last
        #expect(change?.direction == attack)
        #expect(change?.sender == "writer" + attack)
        #expect(change?.keys == [attack])

        // As stored, seen by the superuser: the same text, and the table is still there.
        #expect(try server.psql("SELECT to_regclass('wormhole.mailboxes') IS NOT NULL") == "t")
        #expect(try server.psql("SELECT key FROM wormhole.suite_values WHERE grp = '\(group)'") == attack)
        #expect(try server.psql("SELECT queue FROM wormhole.queues WHERE grp = '\(group)'") == attack)
        let sender = "SELECT sender FROM wormhole.mailboxes WHERE grp = '\(group)' AND identifier = 'raw'"
        #expect(try server.psql(sender) == "writer" + attack)
    }

    // MARK: Passwords

    @Test("A password never appears in descriptions, errors, the engine's logs across a restart, or the tool's output")
    func passwordsNeverPrinted() async throws { try await offThePool { try passwordsNeverPrintedBody() } }

    func passwordsNeverPrintedBody() throws {
        if let reason = LocalPostgresServer.unavailableReason() { try Test.cancel(Comment(rawValue: reason)) }
        let password = "s3cret-Pa55"
        // Durable: an immediate stop of a server without fsync and synchronous commits loses its last commits.
        let server = try LocalPostgresServer(password: password, durable: true)
        defer { server.close() }
        let url = server.url
        #expect(url.contains(password), "the URL carries the password, or this test proves nothing")
        let group = uniqueGroup("passwords")

        let location = try PostgresLocation(url: url)
        #expect(!location.description.contains(password))
        #expect(!String(describing: location).contains(password))
        #expect(location.description.contains("wormhole:***@"))

        // A working engine whose logs, at every level, are collected: postgres-nio's too.
        let logs = LogLines()
        let logger = logs.logger()
        let engine = try PostgresEngine(url: url, group: group, logger: logger)
        defer { engine.close() }
        #expect(!engine.description.contains(password))
        #expect(!String(reflecting: engine).contains(password))
        let wormhole = Wormhole(engine: engine, sender: "watcher", logger: logger)
        let received = Collector<String>()
        let listener = try wormhole.listenForMessage(withIdentifier: "box", as: String.self) { received.append($0) }
        defer { listener.cancel() }
        try wormhole.passMessageObject("before", identifier: "box")
        #expect(eventually { received.values.contains("before") })

        // The restart drops every connection: the listening one reconnects, and says so in the log.
        try server.restart(mode: .immediate)
        #expect(eventually(timeout: 30) { logs.contains("listening again") }, "\(logs.lines)")
        let lastError = Collector<String>()
        let passed = eventually(timeout: 20) {
            do {
                try wormhole.passMessageObject("after", identifier: "box")
                return true
            } catch {
                lastError.append("\(error)")
                return false
            }
        }
        #expect(passed, "\(lastError.values.suffix(3))")
        #expect(lastError.count <= 1, "a call failed more than once after the restart: \(lastError.values.suffix(3))")
        #expect(eventually(timeout: 20) { received.values.contains("after") })
        #expect(logs.lines.count > 1, "the handler collected nothing: the logger was not used")
        #expect(!logs.contains(password), "\(logs.lines.filter { $0.contains(password) })")

        // A wrong password, and an unreachable port: clear errors without the password given.
        let wrongPassword = "Wr0ng-s3cret"
        let wrongURL = url.replacingOccurrences(of: password, with: wrongPassword)
        let failedLogs = LogLines()
        let wrong = wormholeError {
            _ = try PostgresEngine(url: wrongURL, group: group, logger: failedLogs.logger())
        }
        #expect(wrong?.code == .serverUnavailable)
        #expect(wrong?.message.contains("28P01") == true, "\(String(describing: wrong))")
        let unreachable = wormholeError {
            _ = try PostgresEngine(
                url: "postgres://wormhole:\(password)@127.0.0.1:1/wormhole?sslmode=disable",
                group: group,
                logger: failedLogs.logger()
            )
        }
        #expect(unreachable?.code == .serverUnavailable)
        for error in [wrong, unreachable].compactMap({ $0 }) {
            for text in [error.message, "\(error)", String(reflecting: error)] {
                #expect(!text.contains(password) && !text.contains(wrongPassword), "\(text)")
            }
        }
        #expect(!failedLogs.contains(password) && !failedLogs.contains(wrongPassword))

        // The tool, given a wrong password: fails, and prints neither password.
        let tool = try WormholeTool.run(["queue-status", "x", "--postgres", wrongURL, "--group", group])
        #expect(tool.status != 0)
        #expect(tool.error.contains("28P01"), "\(tool.error)")
        for text in [tool.output, tool.error] {
            #expect(!text.contains(password) && !text.contains(wrongPassword), "\(text)")
        }
    }

    @Test(
        "A URL that does not parse is not echoed with its password",
        arguments: [
            "postgres://wormhole:s3cret#Pa55@127.0.0.1:5432/wormhole",
            "postgres://wormhole:s3cret/Pa55@127.0.0.1:5432/wormhole",
            "postgres://wormhole:s3cret?Pa55@127.0.0.1:5432/wormhole",
        ]
    )
    func unparsableURL(url: String) async throws {
        try await offThePool {
            let error = wormholeError { _ = try PostgresLocation(url: url) }
            #expect(error?.code == .serverUnavailable)
            #expect(error?.message.contains("s3cret") == false, "\(String(describing: error))")
        }
    }

    @Test(
        "A password that makes the URL parse another way (a port, then a path) is not echoed",
        arguments: [
            "postgres://2024/Xy5ecret@127.0.0.1:1/wormhole", "postgres://app:2024/Xy5ecret@127.0.0.1:1/wormhole",
        ]
    )
    func passwordParsedAsAPath(url: String) async throws {
        try await offThePool {
            // Either the URL is refused, or it is taken apart so that the password lands in the port and the path.
            let location: PostgresLocation
            do {
                location = try PostgresLocation(url: url)
            } catch {
                #expect(!"\(error)".contains("Xy5ecret"), "\(error)")
                return
            }
            #expect(!location.description.contains("Xy5ecret"), "\(location)")
            #expect(!location.description.contains("2024"), "\(location)")
        }
    }

    @Test("A password given as libpq's query item `password` is not echoed in the description nor in errors")
    func passwordQueryItem() async throws { try await offThePool { try passwordQueryItemBody() } }

    func passwordQueryItemBody() throws {
        // Port 1: nothing listens there, so the connection is refused at once and no server is needed.
        let url = "postgres://wormhole@127.0.0.1:1/wormhole?sslmode=disable&password=s3cret-Pa55"
        let location = try PostgresLocation(url: url)
        #expect(!location.description.contains("s3cret"), "\(location)")
        let error = wormholeError { _ = try PostgresEngine(url: url, group: uniqueGroup("query-password")) }
        #expect(error?.code == .serverUnavailable)
        #expect(error?.message.contains("s3cret") == false, "\(String(describing: error))")
    }

    // MARK: TLS

    @Test(
        "On a TLS server: disable refused, require and verify-full work, a wrong trust fails, require checks sslrootcert"
    )
    func tls() async throws { try await offThePool { try tlsBody() } }

    func tlsBody() throws {
        if let reason = LocalPostgresServer.unavailableReason() { try Test.cancel(Comment(rawValue: reason)) }
        if Self.program("openssl") == nil { try Test.cancel("openssl is not installed") }
        let server = try LocalPostgresServer(tls: true)
        defer { server.close() }
        let certificate = try #require(server.certificatePath)
        #expect(FileManager.default.fileExists(atPath: certificate))
        let group = uniqueGroup("tls")
        func url(host: String = "127.0.0.1", _ query: String) -> String {
            "postgres://wormhole@\(host):\(server.port)/wormhole?\(query)"
        }

        // Unencrypted: pg_hba.conf has no line for it, and the message says so.
        let plain = wormholeError { _ = try PostgresEngine(url: url("sslmode=disable"), group: group) }
        #expect(plain?.code == .serverUnavailable, "\(String(describing: plain))")
        #expect(plain?.message.contains("no encryption") == true, "\(String(describing: plain))")
        #expect(plain?.message.contains("28000") == true, "\(String(describing: plain))")

        // Encrypted, the certificate not checked.
        let required = try PostgresEngine(url: url("sslmode=require"), group: group)
        defer { required.close() }
        // Encrypted, the certificate checked against the server's own, for the name localhost.
        let verified = try PostgresEngine(
            url: url(host: "localhost", "sslmode=verify-full&sslrootcert=\(certificate)"),
            group: group
        )
        defer { verified.close() }
        let sender = Wormhole(engine: required, sender: "required")
        let receiver = Wormhole(engine: verified, sender: "verified")
        let received = Collector<String>()
        let listener = try receiver.listenForMessage(withIdentifier: "box", as: String.self) { received.append($0) }
        defer { listener.cancel() }
        try sender.passMessageObject("over TLS", identifier: "box")
        #expect(eventually { received.values == ["over TLS"] })
        #expect(try receiver.message(withIdentifier: "box", as: String.self) == "over TLS")
        try receiver.passMessageObject("and back", identifier: "reply")
        #expect(try sender.message(withIdentifier: "reply", as: String.self) == "and back")

        // Every connection of the engines, as the server sees them, is encrypted.
        let connections = try server.psql(
            """
            SELECT count(*) || ' ' || bool_and(s.ssl) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
            WHERE a.application_name = 'wormhole'
            """
        )
        let fields = connections.split(separator: " ")
        #expect(fields.count == 2 && (Int(fields[0]) ?? 0) >= 2 && fields[1] == "true", "\(connections)")

        // The certificate's CA, but not for the name used: verify-ca accepts it, verify-full does not.
        let authority = try PostgresEngine(url: url("sslmode=verify-ca&sslrootcert=\(certificate)"), group: group)
        #expect(try Wormhole(engine: authority).message(withIdentifier: "box", as: String.self) == "over TLS")
        authority.close()
        let otherName = wormholeError {
            _ = try PostgresEngine(url: url("sslmode=verify-full&sslrootcert=\(certificate)"), group: group)
        }
        #expect(otherName?.code == .serverUnavailable, "\(String(describing: otherName))")

        // require with a root certificate checks the chain against it, as libpq does: the server's own passes,
        // another authority's fails.
        let requiredAndChecked = try PostgresEngine(
            url: url("sslmode=require&sslrootcert=\(certificate)"),
            group: group
        )
        #expect(try Wormhole(engine: requiredAndChecked).message(withIdentifier: "box", as: String.self) == "over TLS")
        requiredAndChecked.close()
        let otherDirectory = TemporaryDirectory()
        let otherAuthority = otherDirectory("other-authority.crt")
        let openssl = Process()
        openssl.executableURL = URL(fileURLWithPath: try #require(Self.program("openssl")))
        openssl.arguments = [
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
            "-keyout", otherDirectory("other-authority.key"), "-out", otherAuthority,
        ]
        openssl.standardOutput = FileHandle.nullDevice
        openssl.standardError = FileHandle.nullDevice
        try openssl.run()
        openssl.waitUntilExit()
        #expect(openssl.terminationStatus == 0)
        let wrongAuthority = wormholeError {
            _ = try PostgresEngine(url: url("sslmode=require&sslrootcert=\(otherAuthority)"), group: group)
        }
        #expect(wrongAuthority?.code == .serverUnavailable, "\(String(describing: wrongAuthority))")
        #expect(wrongAuthority?.message.contains("certificate") == true, "\(String(describing: wrongAuthority))")

        // verify-full without the root certificate trusts the system's authorities, which never signed it.
        let untrusted = wormholeError {
            _ = try PostgresEngine(url: url(host: "localhost", "sslmode=verify-full"), group: group)
        }
        #expect(untrusted?.code == .serverUnavailable, "\(String(describing: untrusted))")
    }

    @Test("A role that logs in with a client certificate: sslcert and sslkey connect, and nothing else does")
    func clientCertificate() async throws { try await offThePool { try clientCertificateBody() } }

    func clientCertificateBody() throws {
        if let reason = LocalPostgresServer.unavailableReason() { try Test.cancel(Comment(rawValue: reason)) }
        if Self.program("openssl") == nil { try Test.cancel("openssl is not installed") }
        let server = try LocalPostgresServer(tls: true)
        defer { server.close() }
        let (certificate, key) = try #require(server.clientCertificate)
        let authority = try #require(server.certificatePath)
        let role = LocalPostgresServer.certifiedRole
        let group = uniqueGroup("certified")
        try server.psql("CREATE ROLE \(role) LOGIN", database: "postgres")
        let administration = try PostgresAdministration(
            url: "postgres://wormhole@127.0.0.1:\(server.port)/wormhole?sslmode=require"
        )
        defer { administration.close() }
        try administration.setUp()
        try administration.grant(group: group, to: role)
        let base = "postgres://\(role)@localhost:\(server.port)/wormhole?sslrootcert=\(authority)"

        // With its certificate and key, over a verified connection: it works, as that role.
        let engine = try PostgresEngine(
            url: base + "&sslmode=verify-full&sslcert=\(certificate)&sslkey=\(key)",
            group: group
        )
        defer { engine.close() }
        let wormhole = Wormhole(engine: engine, sender: "certified")
        try wormhole.passMessageObject("by certificate", identifier: "box")
        #expect(try wormhole.message(withIdentifier: "box", as: String.self) == "by certificate")
        let users = try server.psql(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.usename = '\(role)' AND s.client_dn = '/CN=\(role)'"
        )
        #expect(Int(users) ?? 0 >= 1, "no connection of \(role) with its certificate: \(users)")

        // Without the certificate the server refuses the role; with another's key, the TLS handshake fails.
        let without = wormholeError { _ = try PostgresEngine(url: base + "&sslmode=verify-full", group: group) }
        #expect(without?.code == .serverUnavailable, "\(String(describing: without))")
        let scratch = TemporaryDirectory()
        let otherKey = scratch("other.key")
        let made = Process()
        made.executableURL = URL(fileURLWithPath: try #require(Self.program("openssl")))
        made.arguments = ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", otherKey]
        made.standardOutput = FileHandle.nullDevice
        made.standardError = FileHandle.nullDevice
        try made.run()
        made.waitUntilExit()
        let mismatched = wormholeError {
            _ = try PostgresEngine(
                url: base + "&sslmode=verify-full&sslcert=\(certificate)&sslkey=\(otherKey)",
                group: group
            )
        }
        #expect(mismatched?.code == .serverUnavailable, "\(String(describing: mismatched))")
        try server.psql("DROP OWNED BY \(role); DROP ROLE \(role)", database: "wormhole")
    }

    // MARK: Helpers

    /// A role name no other test uses: `r_` and 16 hexadecimal digits.
    static func uniqueRole() -> String {
        "r_" + String(UInt64.random(in: 0...UInt64.max), radix: 16)
    }

    /// The URL of `server` as `user`, without a password: the test run's server trusts TCP clients.
    static func url(_ server: LocalPostgresServer, user: String) -> String {
        "postgres://\(user)@127.0.0.1:\(server.port)/wormhole?sslmode=disable"
    }

    /// The path of a program on PATH (or in /usr/bin), nil when it is not installed.
    static func program(_ name: String) -> String? {
        let directories = (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":").map(String.init)
        return (directories + ["/usr/bin", "/bin"]).map { $0 + "/" + name }
            .first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// Drops roles and their privileges; what they could not drop is left to the server's removal.
    static func dropRoles(_ roles: [String], on server: LocalPostgresServer) {
        let list = roles.joined(separator: ", ")
        // Under the lock grants take (the migrations' advisory lock): revoking privileges on the schema while another
        // test's grant changes them fails with "tuple concurrently updated".
        _ = try? server.psql("SELECT pg_advisory_xact_lock(8606223227157441637); DROP OWNED BY \(list)")
        _ = try? server.psql("DROP ROLE IF EXISTS \(list)", database: "postgres")
    }
}

/// The lines a logger wrote, with their metadata, from any thread.
final class LogLines: Sendable {
    private let storage = Collector<String>()

    var lines: [String] { storage.values }

    func contains(_ text: String) -> Bool { storage.values.contains { $0.contains(text) } }

    /// A logger at the trace level whose every line, with its metadata, lands here.
    func logger() -> Logger {
        var logger = Logger(label: "wormhole.postgres.test") { _ in Handler(lines: self) }
        logger.logLevel = .trace
        return logger
    }

    fileprivate func append(_ line: String) { storage.append(line) }

    private struct Handler: LogHandler {
        let lines: LogLines
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            let all = metadata.merging(event.metadata ?? [:]) { $1 }
            let fields = all.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
            let error = event.error.map { " error=\($0)" } ?? ""
            lines.append("\(event.level) \(event.message) \(fields)\(error)")
        }
    }
}

/// Two login roles, each granted a group of its own (`one` → `groupA`, `two` → `groupB`) by the URL's user,
/// `wormhole`, which owns the database and sets up the schema; ``close()`` drops the roles.
struct GrantedRoles {
    let server: LocalPostgresServer
    let administration: PostgresAdministration
    let one = PostgresSecurityTests.uniqueRole()
    let two = PostgresSecurityTests.uniqueRole()
    let groupA: String
    let groupB: String

    init(_ server: LocalPostgresServer, prefix: String) throws {
        self.server = server
        groupA = uniqueGroup("\(prefix)-a")
        groupB = uniqueGroup("\(prefix)-b")
        let roles = [one, two]
        do {
            try server.psql("CREATE ROLE \(one) LOGIN PASSWORD 'one-\(one)'", database: "postgres")
            try server.psql("CREATE ROLE \(two) LOGIN PASSWORD 'two-\(two)'", database: "postgres")
            administration = try PostgresAdministration(url: server.url)
        } catch {
            PostgresSecurityTests.dropRoles(roles, on: server)
            throw error
        }
        do {
            try administration.setUp()
            try administration.grant(group: groupA, to: one)
            try administration.grant(group: groupB, to: two)
        } catch {
            close()
            throw error
        }
    }

    func close() {
        administration.close()
        PostgresSecurityTests.dropRoles([one, two], on: server)
    }

    /// An engine of `group` as `user`, on a schema that is set up.
    func engine(_ user: String, _ group: String) throws -> PostgresEngine {
        try PostgresEngine(url: PostgresSecurityTests.url(server, user: user), group: group, setsUpSchema: false)
    }
}
