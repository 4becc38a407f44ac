import ArgumentParser
import Foundation
import WormholeKit

/// Checks that a command-line message is JSON; returns its bytes.
package func validatedJSON(_ argument: String?, what: String) throws -> Data {
    let text = argument.map { Data($0.utf8) } ?? FileHandle.standardInput.readDataToEndOfFile()
    let trimmed = Data(String(decoding: text, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines).utf8)
    do {
        _ = try JSONSerialization.jsonObject(with: trimmed, options: [.fragmentsAllowed])
    } catch {
        throw Output.fail(
            "the \(what) is not valid JSON, so nothing was done: \(error.localizedDescription)",
            status: 2
        )
    }
    return trimmed
}

/// Output helpers: whole lines, written straight to the descriptor so that each one is flushed at once.
package enum Output {
    package static func line(_ text: String) {
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }

    package static func error(_ text: String) {
        FileHandle.standardError.write(Data(("wormhole: " + text + "\n").utf8))
    }

    /// Exits with `status` after saying why on standard error.
    package static func fail(_ text: String, status: Int32 = 1) -> ExitCode {
        error(text)
        return ExitCode(status)
    }

    /// Waits for `done`, up to `timeout` seconds when one is given; returns whether it came.
    package static func wait(for done: DispatchSemaphore, timeout: Double?) -> Bool {
        guard let timeout else {
            done.wait()
            return true
        }
        return done.wait(timeout: .now() + timeout) == .success
    }

    /// A payload as one line of JSON: compact JSON as it is, other JSON re-serialised without newlines.
    package static func jsonLine(_ payload: Data) -> String {
        if !payload.contains(UInt8(ascii: "\n")) { return String(decoding: payload, as: UTF8.self) }
        if let object = try? JSONSerialization.jsonObject(with: payload, options: [.fragmentsAllowed]),
            let compact = try? JSONSerialization.data(
                withJSONObject: object,
                options: [.fragmentsAllowed, .sortedKeys]
            )
        {
            return String(decoding: compact, as: UTF8.self)
        }
        return String(decoding: payload, as: UTF8.self).replacingOccurrences(of: "\n", with: " ")
    }

    /// A time as the tool prints it: ISO 8601, UTC, with fractional seconds.
    package static func time(_ date: Date) -> String {
        ISO8601DateFormatter.string(
            from: date,
            timeZone: .gmt,
            formatOptions: [.withInternetDateTime, .withFractionalSeconds]
        )
    }

    /// A JSON object as one line, keys sorted.
    package static func objectLine(_ fields: [String: JSONValue]) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return (try? encoder.encode(fields)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
    }

    /// An envelope as one JSON object: sequence, generation, sender, time and the payload (as JSON when it is).
    package static func envelopeLine(_ envelope: Envelope) -> String {
        let time = time(envelope.date)
        let payload =
            (try? JSONSerialization.jsonObject(with: envelope.payload, options: [.fragmentsAllowed])) != nil
            ? jsonLine(envelope.payload)
            : "\"" + envelope.payload.base64EncodedString() + "\""
        let sender = String(decoding: try! JSONEncoder().encode(envelope.sender), as: UTF8.self)
        return "{\"sequence\":\(envelope.sequence),\"generation\":\(envelope.generation),\"sender\":\(sender),"
            + "\"time\":\"\(time)\",\"payload\":\(payload)}"
    }
}
