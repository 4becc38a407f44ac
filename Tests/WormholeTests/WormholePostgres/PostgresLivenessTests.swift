import Foundation
import Testing
import WormholeCLI
import WormholeKit
import WormholePostgres

/// A live endpoint counts while its process's listening session holds its advisory lock: a process killed with
/// SIGKILL drops its connection, the server ends its session, and senders find nobody within seconds.
@Suite(
    "PostgreSQL engine: live endpoints of processes killed",
    .slow("needs a PostgreSQL server (and some, network namespaces)"),
    .enabled(if: LocalPostgresServer.unavailableReason() == nil, "PostgreSQL is not installed"),
    .limit(minutes: 2)
)
struct PostgresLivenessTests {
    @Test("A listener and a responder killed with SIGKILL are notReachable within seconds, and their rows are swept")
    func killedEndpoints() async throws { try await offThePool { try killedEndpointsBody() } }

    func killedEndpointsBody() throws {
        let url = try requireTestServerURL()
        let group = uniqueGroup("liveness")
        let location = ["--postgres", url, "--group", group]
        let engine = try PostgresEngine(url: url, group: group)
        defer { engine.close() }
        let wormhole = Wormhole(engine: engine, sender: "sender")

        let listener = try RunningTool(["live-listen", "ping"] + location)
        #expect(listener.waitForError(containing: "listening to ping"))
        let responder = try RunningTool(["respond", "echo", "--exec", "cat"] + location)
        #expect(responder.waitForError(containing: "responding to echo"))
        #expect(try wormhole.sendMessage(1, identifier: "ping") == 1)
        let echoed = try WormholeTool.run(["request", "echo", "7"] + location)
        #expect(echoed.status == 0 && echoed.lines == ["7"], "\(echoed.error)")

        listener.kill()
        responder.kill()
        _ = listener.finish(timeout: 10)
        _ = responder.finish(timeout: 10)
        // The server notices a closed connection at once on one host; a cut link takes its keep-alives' seconds.
        #expect(
            eventually(timeout: 10) {
                (try? wormhole.sendMessage(2, identifier: "ping")) == nil
            },
            "a killed listener stops counting"
        )
        let error = wormholeError { _ = try wormhole.sendMessage(3, identifier: "ping") }
        #expect(error?.code == .notReachable)
        let administration = try PostgresAdministration(url: url)
        defer { administration.close() }
        func endpoints() throws -> [PostgresStatus.Endpoint] {
            try administration.status(group: group).groups.first { $0.name == group }?.liveEndpoints ?? []
        }
        let left = try endpoints()
        #expect(
            left.count == 2 && left.allSatisfy { !$0.isAlive },
            "their rows stay until swept, counted dead: \(left)"
        )

        // A request starts this process's listening connection, which sweeps the rows of those gone.
        let refused = try WormholeTool.run(["request", "echo", "8", "--timeout", "30"] + location)
        #expect(refused.status == 1)
        #expect(refused.error.contains("No process answers"), "\(refused.error)")
        #expect(try endpoints().isEmpty)
        let newcomer = try wormhole.listenForLiveMessages(withIdentifier: "other", as: Int.self) { _ in }
        defer { newcomer.cancel() }
        let after = try endpoints()
        #expect(after.map(\.identifier) == ["other"] && after.allSatisfy(\.isAlive), "\(after)")
    }

    @Test("A listener whose row could not be removed when it stopped is removed at the listening loop's next tick")
    func unremovedEndpointRemovedLater() async throws {
        try await offThePool { try unremovedEndpointRemovedLaterBody() }
    }

    func unremovedEndpointRemovedLaterBody() throws {
        let server = try LocalPostgresServer()
        defer { server.close() }
        let group = uniqueGroup("unremoved")
        let engine = try PostgresEngine(url: server.url, group: group)
        defer { engine.close() }
        let wormhole = Wormhole(engine: engine, sender: "test")
        let listener = try wormhole.listenForLiveMessageData(withIdentifier: "ping") { _ in }
        #expect(try wormhole.sendMessageData(Data("1".utf8), identifier: "ping") == 1)
        func rows() throws -> String {
            try server.psql("SELECT count(*) FROM wormhole.live_endpoints WHERE grp = '\(group)' AND kind = 'listen'")
        }
        // Removing the row fails while this process goes on listening: it stays, and looks alive.
        _ = try server.psql(
            """
            CREATE FUNCTION wormhole_test_refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'refused by the test'; END $$;
            CREATE TRIGGER refuse_delete BEFORE DELETE ON wormhole.live_endpoints
                FOR EACH ROW EXECUTE FUNCTION wormhole_test_refuse_delete();
            """
        )
        listener.cancel()
        #expect(try rows() == "1")
        // Once removing works again, the next tick of the listening loop (every 2 s) removes it.
        _ = try server.psql("DROP TRIGGER refuse_delete ON wormhole.live_endpoints")
        #expect(eventually(timeout: 10) { (try? rows()) == "0" })
        let error = wormholeError { _ = try wormhole.sendMessageData(Data("2".utf8), identifier: "ping") }
        #expect(error?.code == .notReachable, "\(String(describing: error))")
    }

    @Test("A large live message whose body is gone when it comes reaches the listener's error handler, not only a log")
    func lostBodyReported() async throws {
        try await offThePool { try lostBodyReportedBody() }
    }

    func lostBodyReportedBody() throws {
        let server = try LocalPostgresServer()
        defer { server.close() }
        let engine = try PostgresEngine(url: server.url, group: uniqueGroup("lost-body"))
        defer { engine.close() }
        let wormhole = Wormhole(engine: engine, sender: "test")
        let errors = Collector<WormholeError.Code>()
        let received = Collector<Int>()
        let listener = try wormhole.listenForLiveMessageData(
            withIdentifier: "big",
            errorHandler: { errors.append($0.code) },
            listener: { received.append($0.count) }
        )
        defer { listener.cancel() }
        // A body too large for the notification waits in its own row, and arrives whole.
        #expect(try wormhole.sendMessageData(Data(count: 20_000), identifier: "big") == 1)
        #expect(eventually { received.values == [20_000] })
        // Another tool removes every body as soon as it is written: the next large message is lost on its way, and
        // the listener hears of it.
        _ = try server.psql(
            """
            CREATE FUNCTION wormhole_test_drop_body() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN DELETE FROM wormhole.live_bodies WHERE grp = NEW.grp AND id = NEW.id; RETURN NULL; END $$;
            CREATE TRIGGER drop_body AFTER INSERT ON wormhole.live_bodies
                FOR EACH ROW EXECUTE FUNCTION wormhole_test_drop_body();
            """
        )
        #expect(try wormhole.sendMessageData(Data(count: 20_000), identifier: "big") == 1)
        #expect(eventually { errors.values == [.notReachable] })
        #expect(received.values == [20_000])
        // A small message rides the notification, and still arrives.
        #expect(try wormhole.sendMessageData(Data(count: 10), identifier: "big") == 1)
        #expect(eventually { received.values == [20_000, 10] })
    }
}

/// The server commits a statement outside a transaction block at the Sync after it, and sends the statement's end
/// only then: a write must not return before, or a server that dies at that moment loses what the caller was told is
/// stored, and other connections do not see it yet. Deferred triggers that make the commit of this group's rows take
/// half a second show that each kind of write waits for its commit, a large result included (the server sends rows
/// beyond its 8 KiB output buffer before the commit, but the statement's end after it).
@Suite(
    "PostgreSQL engine: a write returns once committed",
    .slow("needs a PostgreSQL server (and some, network namespaces)"),
    .enabled(if: LocalPostgresServer.unavailableReason() == nil, "PostgreSQL is not installed"),
    .limit(minutes: 3)
)
struct PostgresCommitTests {
    @Test("An acknowledgement alone moves the stored position, never back, and is refused once the consumer is dropped")
    func acknowledgementAlone() async throws {
        try await offThePool {
            let server = try requireTestServer()
            let group = uniqueGroup("acknowledge")
            let engine = try PostgresEngine(url: server.url, group: group)
            defer { engine.close() }
            let log = try engine.queueLog("jobs", sender: "writer", retention: .seconds(3600))
            let cursor = try log.openCursor(consumer: "reader")
            try log.append(contentsOf: (0..<5).map { Data("job \($0)".utf8) })
            func stored() throws -> String {
                try server.psql(
                    "SELECT position FROM wormhole.queue_consumers WHERE grp = '\(group)' AND consumer = 'reader'"
                )
            }
            try cursor.acknowledge(through: 3)
            #expect(try stored() == "3")
            #expect(cursor.position == 3)
            try cursor.acknowledge(through: 2)  // an older end moves nothing back
            #expect(try stored() == "3")
            #expect(try cursor.read(maximumCount: 10).map(\.offset) == [3, 4])

            _ = try server.psql("DELETE FROM wormhole.queue_consumers WHERE grp = '\(group)' AND consumer = 'reader'")
            let error = #expect(throws: WormholeError.self) { try cursor.acknowledge(through: 4) }
            #expect(error?.code == .serverRejected)
            #expect(error?.message.contains("no longer registered") == true, "\(String(describing: error))")
        }
    }

    @Test(
        "A listener registered while the server is away returns once the first connection fails, not after 10 s, and is woken when its connection is made"
    )
    func listenerRegisteredDuringOutage() async throws {
        try await offThePool { try listenerRegisteredDuringOutageBody() }
    }

    /// Runs `body` with a server of its own, stopped, and two engines of one group opened on it before it stopped.
    func duringOutage(
        _ body: (_ server: LocalPostgresServer, _ first: PostgresEngine, _ second: PostgresEngine) throws -> Void
    ) throws {
        let server = try LocalPostgresServer()
        defer { server.close() }
        let group = uniqueGroup("outage")
        let first = try PostgresEngine(url: server.url, group: group)
        defer { first.close() }
        let second = try PostgresEngine(url: server.url, group: group)
        defer { second.close() }
        server.stop()
        try body(server, first, second)
    }

    func listenerRegisteredDuringOutageBody() throws {
        // Stopped while a listener registers: its notifications start only once the listening connection is made,
        // and a message passed before that reaches it only if that connection wakes it.
        try duringOutage { server, listening, passing in
            let received = Collector<Int>()
            // Waits for the first attempt at a listening connection only (refused at once here), then registers all the
            // same. Before, it waited 10 s for a connection; the bound below is far from both.
            let registering = ContinuousClock.now
            let listener = try Wormhole(engine: listening, sender: "listener").listenForMessage(
                withIdentifier: "news",
                as: Int.self,
                on: .notifierThread
            ) { received.append($0) }
            defer { listener.cancel() }
            let registration = ContinuousClock.now - registering
            #expect(registration < .seconds(5), "registering took \(registration)")
            try server.start()
            // Passed as soon as the server takes it, most likely before the listening connection is made again (its
            // back-off reaches 2 s while the server is away).
            let wormhole = Wormhole(engine: passing, sender: "passer")
            #expect(eventually { (try? wormhole.passMessageObject(7, identifier: "news")) != nil })
            // The safety poll would deliver it 10 s after the connection; the connection's own wake-up, within seconds.
            #expect(eventually(timeout: 6) { received.values == [7] }, "\(received.values)")
        }
    }

    @Test(
        "A live listener registered while the server is away returns once the first connection fails, and is reachable once its connection is made; one cancelled meanwhile never is"
    )
    func liveListenerRegisteredDuringOutage() async throws {
        try await offThePool { try liveListenerRegisteredDuringOutageBody() }
    }

    func liveListenerRegisteredDuringOutageBody() throws {
        try duringOutage { server, listening, sending in
            let received = Collector<Int>()
            let listeningWormhole = Wormhole(engine: listening, sender: "listener")
            // Waits for one attempt at the listening connection (refused at once here), not for the connection: before,
            // it waited 10 s and then failed with serverUnavailable.
            let registering = ContinuousClock.now
            let listener = try listeningWormhole.listenForLiveMessages(
                withIdentifier: "ticks",
                as: Int.self,
                on: .notifierThread
            ) { received.append($0) }
            defer { listener.cancel() }
            // Pending as well, and cancelled before the server comes back, without waiting for it: never registered.
            let gone = try listeningWormhole.listenForLiveMessageData(withIdentifier: "gone", on: .notifierThread) {
                _ in
            }
            let cancelling = ContinuousClock.now
            gone.cancel()
            let registration = cancelling - registering
            let cancellation = ContinuousClock.now - cancelling
            #expect(registration < .seconds(5), "registering took \(registration)")
            #expect(cancellation < .seconds(2), "cancelling took \(cancellation)")
            try server.start()
            // The listening connection, once made again (its back-off reaches 2 s while the server is away), writes the
            // pending endpoint's row and listens on its channel: the message then reaches it.
            let wormhole = Wormhole(engine: sending, sender: "sender")
            #expect(eventually(timeout: 15) { (try? wormhole.sendMessage(1, identifier: "ticks")) == 1 })
            #expect(eventually { received.values.contains(1) }, "\(received.values)")
            let unreachable = #expect(throws: WormholeError.self) { try wormhole.sendMessage(2, identifier: "gone") }
            #expect(unreachable?.code == .notReachable, "\(String(describing: unreachable))")
        }
    }

    @Test("A request waits for a server that does not answer no longer than its own time-out")
    func requestBoundedByItsTimeOut() async throws {
        try await offThePool { try requestBoundedByItsTimeOutBody() }
    }

    func requestBoundedByItsTimeOutBody() throws {
        // A server of its own: a table of the engine's is locked for seconds.
        let server = try LocalPostgresServer()
        defer { server.close() }
        let engine = try PostgresEngine(url: server.url, group: uniqueGroup("bounded"))
        defer { engine.close() }
        let transport = try engine.liveTransport(sender: "client")
        // The listening connection is made first (it sweeps the table locked below).
        let first = transport.request(Data("x".utf8), identifier: "lookup", timeout: .seconds(10))
        #expect(first.failureValue?.code == .notReachable)
        // Another session holds the table a request's statement reads, for 5 s: the statement waits for it.
        let holder = Thread {
            _ = try? server.psql(
                "BEGIN; LOCK TABLE wormhole.live_endpoints IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(5); COMMIT;"
            )
        }
        holder.start()
        let locked = eventually {
            (try? server.psql(
                """
                SELECT count(*) FROM pg_locks WHERE relation = 'wormhole.live_endpoints'::regclass
                    AND mode = 'AccessExclusiveLock' AND granted
                """
            )) == "1"
        }
        #expect(locked)
        let started = Date()
        let result = transport.request(Data("x".utf8), identifier: "lookup", timeout: .milliseconds(500))
        let waited = Date().timeIntervalSince(started)
        #expect(result.failureValue?.code == .timedOut, "\(result)")
        // Its 0.5 s, where the engine's time-out (30 s) or the lock (5 s) used to bound it.
        #expect(waited < 3, "waited \(waited) s")
    }

    @Test("An enqueue, a mailbox write and an acknowledgement return after their slow commit, seen by others at once")
    func writesWaitForTheirCommit() async throws { try await offThePool { try writesWaitForTheirCommitBody() } }

    func writesWaitForTheirCommitBody() throws {
        // A server of its own: making (or dropping) a trigger locks its table, which on the shared server stalled
        // other tests' statements, and once made one of them fail with a deadlock.
        let server = try LocalPostgresServer()
        defer { server.close() }
        let group = uniqueGroup("commit")
        let engine = try PostgresEngine(url: server.url, group: group)
        defer { engine.close() }
        let wormhole = Wormhole(engine: engine, sender: "writer")
        let trigger = "slow_commit_\(UInt32.random(in: 0...UInt32.max))"
        _ = try server.psql(
            """
            CREATE OR REPLACE FUNCTION public.wormhole_test_slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_sleep(0.5); RETURN NULL; END $$;
            CREATE CONSTRAINT TRIGGER \(trigger)_queue AFTER INSERT ON wormhole.queue_records
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.grp = '\(group)' AND NEW.queue = 'jobs')
                EXECUTE FUNCTION public.wormhole_test_slow_commit();
            CREATE CONSTRAINT TRIGGER \(trigger)_mailbox AFTER INSERT OR UPDATE ON wormhole.mailboxes
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.grp = '\(group)')
                EXECUTE FUNCTION public.wormhole_test_slow_commit();
            CREATE CONSTRAINT TRIGGER \(trigger)_consumer AFTER UPDATE ON wormhole.queue_consumers
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.grp = '\(group)' AND NEW.position > 1)
                EXECUTE FUNCTION public.wormhole_test_slow_commit();
            """
        )
        let queued = Date()
        try wormhole.queue("jobs").enqueue("first")
        #expect(Date().timeIntervalSince(queued) >= 0.5, "the enqueue waited for its commit")
        #expect(try server.psql("SELECT count(*) FROM wormhole.queue_records WHERE grp = '\(group)'") == "1")
        let passed = Date()
        try wormhole.passMessageObject("hello", identifier: "note")
        #expect(Date().timeIntervalSince(passed) >= 0.5, "the mailbox write waited for its commit")
        #expect(
            try server.psql("SELECT count(*) FROM wormhole.mailboxes WHERE grp = '\(group)' AND payload IS NOT NULL")
                == "1"
        )

        // An acknowledgement that reads a batch larger than the server's output buffer: most records come before the
        // commit, the statement's end after it.
        let log = try engine.queueLog("large", sender: "writer", retention: .seconds(3600))
        let cursor = try log.openCursor(consumer: "reader")
        try log.append(contentsOf: (0..<40).map { _ in Data(repeating: 0x61, count: 1024) })
        let first = try cursor.read(maximumCount: 1)
        #expect(first.map(\.offset) == [0])
        _ = try cursor.acknowledge(through: 1, thenRead: 10)  // the position 1 commits at once
        let acknowledged = Date()
        let batch = try cursor.acknowledge(through: 11, thenRead: 20)
        #expect(batch.count == 20)
        #expect(Date().timeIntervalSince(acknowledged) >= 0.5, "the acknowledgement waited for its commit")
        #expect(
            try server.psql(
                "SELECT position FROM wormhole.queue_consumers WHERE grp = '\(group)' AND consumer = 'reader'"
            ) == "11"
        )
    }
}
