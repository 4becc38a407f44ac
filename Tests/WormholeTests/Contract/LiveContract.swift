import Foundation
import Testing

@testable import WormholeKit

/// The live contract, for every engine (``LiveTransport``).
///
/// A live message reaches every listener of its identifier at the time it is sent, each message once and in the order
/// sent; nothing is stored, and with no listener sending fails at once with ``WormholeError/Code/notReachable``. A
/// request reaches one responder and returns exactly one of: its reply, ``WormholeError/Code/timedOut`` after the
/// time-out, ``WormholeError/Code/remoteFailure`` (the responder threw), ``WormholeError/Code/notReachable``
/// (nobody responds). Listeners and responders are apart: a message never reaches a responder, a request never a
/// listener. A cancelled listener or responder is no longer reached. A request that its responder drops without an
/// answer fails at once with ``WormholeError/Code/remoteFailure``, never at its time-out.
@Suite("Contract: live messages and requests", .limit(minutes: 3))
struct LiveContract {
    struct Query: Codable, Sendable, Equatable {
        var term: String
        var number: Int
    }
    struct Answer: Codable, Sendable, Equatable {
        var result: String
        var doubled: Int
    }

    @Test("Sending with no listener throws .notReachable", arguments: EngineKind.underTest)
    func noListener(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let app = try fixture.wormhole("app")
            let error = wormholeError { try app.sendMessage(1, identifier: "ping") }
            #expect(error?.code == .notReachable)
        }
    }

    @Test("Two listeners in two wormholes both receive 50 messages, in order", arguments: EngineKind.underTest)
    func twoListeners(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let app = try fixture.wormhole("app")
            let collectors = [Collector<Int>(), Collector<Int>()]
            let listeners = try (0..<2).map { index in
                try fixture.wormhole("listener-\(index)").listenForLiveMessages(withIdentifier: "ping", as: Int.self) {
                    collectors[index].append($0)
                }
            }
            for value in 0..<50 {
                #expect(try app.sendMessage(value, identifier: "ping") == 2, "reaches both listeners")
            }
            for collector in collectors {
                #expect(eventually { collector.count >= 50 })
                #expect(collector.values == Array(0..<50), "each message once, in order")
            }
            for listener in listeners { listener.cancel() }
        }
    }

    @Test(
        "The live(_:) channel: its messages reach its listeners only, its requests its responders",
        arguments: EngineKind.underTest
    )
    func liveChannel(kind: EngineKind) async throws {
        let fixture = try EngineFixture(kind)
        let app = try fixture.wormhole("app")
        let widget = try fixture.wormhole("widget")
        let cursor = try widget.live("cursor")
        #expect(cursor.identifier == "cursor")
        let positions = Collector<Int>()
        let listener = try cursor.listen(as: Int.self) { positions.append($0) }
        let other = Collector<Int>()
        let otherListener = try widget.live("other").listen(as: Int.self) { other.append($0) }
        for value in 1...3 { #expect(try app.live("cursor").send(value) == 1) }
        #expect(eventually { positions.values == [1, 2, 3] })
        #expect(other.values.isEmpty, "another channel's listener got nothing")

        let responder = try widget.live("lookup").respond(as: Query.self) { query in
            Answer(result: query.term.uppercased(), doubled: query.number * 2)
        }
        let answer = try await app.live("lookup").request(Query(term: "swift", number: 21), as: Answer.self)
        #expect(answer == Answer(result: "SWIFT", doubled: 42))
        // A message on the requests' channel reaches no responder.
        #expect(wormholeError { try app.live("lookup").send(1) }?.code == .notReachable)
        #expect(wormholeError { _ = try app.live("../escape") }?.code == .invalidIdentifier)
        for cancellable in [listener, otherListener, responder] { cancellable.cancel() }
    }

    @Test("A request gets its reply from a responder in another wormhole", arguments: EngineKind.underTest)
    func requestAndReply(kind: EngineKind) async throws {
        let fixture = try EngineFixture(kind)
        let senders = Collector<String>()
        let responder = try fixture.wormhole("server").respondToRequests(withIdentifier: "lookup", as: Query.self) {
            query in
            senders.append(query.term)
            return Answer(result: query.term.uppercased(), doubled: query.number * 2)
        }
        let client = try fixture.wormhole("client")
        for number in 1...3 {
            let answer = try await client.request(
                Query(term: "swift\(number)", number: number),
                identifier: "lookup",
                as: Answer.self
            )
            #expect(answer == Answer(result: "SWIFT\(number)", doubled: number * 2))
        }
        #expect(senders.values == ["swift1", "swift2", "swift3"], "each request reaches one responder once")
        responder.cancel()
    }

    @Test("Each request reaches exactly one of several responders", arguments: EngineKind.underTest)
    func oneResponderPerRequest(kind: EngineKind) async throws {
        let fixture = try EngineFixture(kind)
        let calls = [Collector<Int>(), Collector<Int>()]
        let responders = try (0..<2).map { index in
            try fixture.wormhole("server-\(index)").respondToRequests(withIdentifier: "lookup", as: Query.self) {
                query in
                calls[index].append(query.number)
                return Answer(result: "server-\(index)", doubled: query.number * 2)
            }
        }
        let client = try fixture.wormhole("client")
        var answeredBy: [String] = []
        for number in 0..<20 {
            let answer = try await client.request(
                Query(term: "q", number: number),
                identifier: "lookup",
                as: Answer.self
            )
            #expect(answer.doubled == number * 2)
            answeredBy.append(answer.result)
        }
        let handled = (calls[0].values + calls[1].values).sorted()
        #expect(handled == Array(0..<20), "each request handled once, by one responder")
        #expect(answeredBy.filter { $0 == "server-0" }.count == calls[0].count, "the reply comes from the one asked")
        for responder in responders { responder.cancel() }
    }

    @Test("liveMessages: an AsyncSequence of the messages; ending it stops listening", arguments: EngineKind.underTest)
    func liveMessagesSequence(kind: EngineKind) async throws {
        let fixture = try EngineFixture(kind)
        let app = try fixture.wormhole("app")
        let got = Collector<Int>()
        // The sequence lives only in the task, so that it is released when the loop ends.
        func startLoop() throws -> Task<[Int], any Error> {
            let sequence = try fixture.wormhole("listener").liveMessages(withIdentifier: "ping", as: Int.self)
            return Task {
                for try await value in sequence {
                    got.append(value)
                    if got.count == 3 { break }
                }
                return got.values
            }
        }
        let loop = try startLoop()
        for value in 1...3 { #expect(try app.sendMessage(value, identifier: "ping") == 1) }
        let outcome = await result(of: loop, within: 10)
        #expect(try outcome?.get() == [1, 2, 3])
        #expect(
            await eventuallyAwaiting { (try? app.sendMessage(0, identifier: "ping")) == nil },
            "the sequence ended and was released: nobody listens any more"
        )
        let error = wormholeError { try app.sendMessage(4, identifier: "ping") }
        #expect(error?.code == .notReachable)
    }

    @Test("A message or request over 64 KiB is refused with .messageTooLarge", arguments: EngineKind.underTest)
    func tooLarge(kind: EngineKind) async throws {
        let fixture = try EngineFixture(kind)
        let server = try fixture.wormhole("server")
        let listener = try server.listenForLiveMessageData(withIdentifier: "big") { _ in }
        let responder = try server.respondToRequestData(withIdentifier: "big") { $0 }
        let client = try fixture.wormhole("client")
        let large = Data(repeating: 7, count: 65 * 1024)
        #expect(wormholeError { try client.sendMessageData(large, identifier: "big") }?.code == .messageTooLarge)
        let request = await wormholeErrorAwaiting { _ = try await client.requestData(large, identifier: "big") }
        #expect(request?.code == .messageTooLarge)
        let small = Data(repeating: 1, count: 60 * 1024)
        #expect(try client.sendMessageData(small, identifier: "big") == 1, "up to the limit, it goes")
        #expect(try await client.requestData(small, identifier: "big") == small)
        listener.cancel()
        responder.cancel()
    }

    @Test("A responder that throws gives .remoteFailure", arguments: EngineKind.underTest)
    func throwingResponder(kind: EngineKind) async throws {
        let fixture = try EngineFixture(kind)
        let reported = Collector<WormholeError>()
        let responder = try fixture.wormhole("server").respondToRequests(
            withIdentifier: "lookup",
            as: Query.self,
            errorHandler: { reported.append($0) }
        ) { (_: Query) throws -> Answer in
            throw ContractFailure()
        }
        let client = try fixture.wormhole("client")
        let error = await wormholeErrorAwaiting {
            _ = try await client.request(Query(term: "x", number: 1), identifier: "lookup", as: Answer.self)
        }
        #expect(error?.code == .remoteFailure)
        #expect(error?.message.contains("contract handler refused") == true, "the responder's error comes back")
        #expect(await eventuallyAwaiting { reported.count == 1 }, "the responder's side is told too")
        #expect(reported.values.first?.code == .handlerFailed)
        responder.cancel()
    }

    @Test("A time-out of .seconds(Int64.max) means as long as it takes", arguments: EngineKind.underTest)
    func hugeTimeout(kind: EngineKind) async throws {
        let fixture = try EngineFixture(kind)
        let responder = try fixture.wormhole("server").respondToRequests(withIdentifier: "lookup", as: Query.self) {
            Answer(result: $0.term, doubled: $0.number * 2)
        }
        let answer = try await fixture.wormhole("client").request(
            Query(term: "x", number: 2),
            identifier: "lookup",
            as: Answer.self,
            timeout: .seconds(Int64.max)
        )
        #expect(answer == Answer(result: "x", doubled: 4))
        responder.cancel()
    }

    @Test("A request with no responder gives .notReachable", arguments: EngineKind.underTest)
    func noResponder(kind: EngineKind) async throws {
        let fixture = try EngineFixture(kind)
        let client = try fixture.wormhole("client")
        let error = await wormholeErrorAwaiting {
            _ = try await client.request(Query(term: "x", number: 1), identifier: "lookup", as: Answer.self)
        }
        #expect(error?.code == .notReachable)
    }

    @Test("A responder that does not answer within the time-out gives .timedOut", arguments: EngineKind.underTest)
    func slowResponder(kind: EngineKind) async throws {
        let fixture = try EngineFixture(kind)
        let started = Collector<Int>()
        let responder = try fixture.wormhole("server").respondToRequests(withIdentifier: "slow", as: Query.self) {
            query in
            started.append(query.number)
            Thread.sleep(forTimeInterval: 1.5)
            return Answer(result: "late", doubled: 0)
        }
        let client = try fixture.wormhole("client")
        let error = await wormholeErrorAwaiting {
            _ = try await client.request(
                Query(term: "x", number: 1),
                identifier: "slow",
                as: Answer.self,
                timeout: .milliseconds(200)
            )
        }
        #expect(error?.code == .timedOut)
        #expect(await eventuallyAwaiting { started.values == [1] }, "the request reached the responder, once")
        responder.cancel()
    }

    @Test(
        "Listeners never receive requests and responders never receive messages",
        arguments: EngineKind.underTest
    )
    func listenersAndRespondersApart(kind: EngineKind) async throws {
        let fixture = try EngineFixture(kind)
        let messages = Collector<Int>()
        let requests = Collector<Query>()
        let server = try fixture.wormhole("server")
        let listener = try server.listenForLiveMessages(withIdentifier: "only-listened", as: Int.self) {
            messages.append($0)
        }
        let responder = try server.respondToRequests(withIdentifier: "only-answered", as: Query.self) { query in
            requests.append(query)
            return Answer(result: "ok", doubled: 0)
        }
        let client = try fixture.wormhole("client")

        let request = await wormholeErrorAwaiting {
            _ = try await client.request(Query(term: "x", number: 1), identifier: "only-listened", as: Answer.self)
        }
        #expect(request?.code == .notReachable, "a listener does not answer requests")
        let message = wormholeError {
            _ = try client.sendMessage(Query(term: "y", number: 2), identifier: "only-answered")
        }
        #expect(message?.code == .notReachable, "a responder does not take messages")

        // Both endpoints still work for their own kind; what they received says nothing crossed over.
        #expect(try client.sendMessage(7, identifier: "only-listened") == 1)
        let answer = try await client.request(Query(term: "z", number: 3), identifier: "only-answered", as: Answer.self)
        #expect(answer == Answer(result: "ok", doubled: 0))
        #expect(await eventuallyAwaiting { messages.values == [7] })
        #expect(messages.values == [7])
        #expect(requests.values == [Query(term: "z", number: 3)])
        listener.cancel()
        responder.cancel()
    }

    @Test("After cancel, listeners and responders are not reachable", arguments: EngineKind.underTest)
    func afterCancel(kind: EngineKind) async throws {
        let fixture = try EngineFixture(kind)
        let server = try fixture.wormhole("server")
        let client = try fixture.wormhole("client")
        let received = Collector<Int>()
        let listener = try server.listenForLiveMessages(withIdentifier: "ping", as: Int.self) { received.append($0) }
        let responder = try server.respondToRequests(withIdentifier: "lookup", as: Query.self) { query in
            Answer(result: query.term, doubled: query.number * 2)
        }
        #expect(try client.sendMessage(1, identifier: "ping") == 1)
        #expect(
            try await client.request(Query(term: "a", number: 1), identifier: "lookup", as: Answer.self).doubled == 2
        )
        #expect(await eventuallyAwaiting { received.values == [1] })

        listener.cancel()
        responder.cancel()
        #expect(listener.isCancelled)
        #expect(responder.isCancelled)
        let message = wormholeError { try client.sendMessage(2, identifier: "ping") }
        #expect(message?.code == .notReachable)
        let request = await wormholeErrorAwaiting {
            _ = try await client.request(Query(term: "b", number: 2), identifier: "lookup", as: Answer.self)
        }
        #expect(request?.code == .notReachable)
        #expect(received.values == [1])
    }

    @Test(
        "A request dropped by its responder unanswered fails at once, not at its time-out",
        arguments: EngineKind.underTest
    )
    func droppedRequestFailsAtOnce(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let server = try fixture.wormhole("server")
            let client = try fixture.wormhole("client")
            // The transport's own calls, on this test's thread: no task has to be scheduled for the promise to hold.
            let received = Collector<String>()
            let responder = try server.liveTransport().respond(identifier: "drop") { request in
                received.append(request.sender)  // and dropped, unanswered
            }
            defer { responder.cancel() }
            let start = ContinuousClock.now
            let result = try client.liveTransport().request(Data("x".utf8), identifier: "drop", timeout: .seconds(30))
            #expect(throws: WormholeError.self) { _ = try result.get() }
            if case .failure(let error) = result { #expect(error.code == .remoteFailure) }
            #expect(ContinuousClock.now - start < .seconds(20), "it failed when dropped, not at its time-out")
            #expect(received.values == ["client"])
        }
    }
}
