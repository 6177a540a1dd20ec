// Drives the SNS endpoint's topics with the AWS SDK for JavaScript v3 (@aws-sdk/client-sns),
// unmodified: subscriptions with filter policies (attributes and body), publishes, PublishBatch
// to a standard and a FIFO topic, and the errors of both. Run by tests/test_sns_js_topics.py:
// `node tests/sns_js_topics.mjs '<config JSON>'` (the queues' ARNs made beforehand); prints one
// JSON object with what each step saw. The test reads the queues afterwards.
import {
  SNSClient,
  CreateTopicCommand,
  PublishBatchCommand,
  PublishCommand,
  SetSubscriptionAttributesCommand,
  SubscribeCommand,
} from "@aws-sdk/client-sns";

const cfg = JSON.parse(process.argv[2]);
const sns = new SNSClient({
  endpoint: cfg.sns,
  region: "us-east-1",
  credentials: { accessKeyId: "testing", secretAccessKey: "testing" },
  maxAttempts: 1,
});
const out = {};

async function failure(promise) {
  try {
    await promise;
    return null;
  } catch (e) {
    return { name: e.name, status: e.$metadata?.httpStatusCode, message: e.message };
  }
}

const str = (v) => ({ DataType: "String", StringValue: v });
const num = (v) => ({ DataType: "Number", StringValue: String(v) });

// a standard topic: one queue filtered on attributes, one on the body, one taking everything
const topic = (await sns.send(new CreateTopicCommand({ Name: cfg.name }))).TopicArn;
out.topic = topic;
const subscribe = (endpoint, attributes) =>
  sns.send(new SubscribeCommand({ TopicArn: topic, Protocol: "sqs", Endpoint: endpoint, Attributes: attributes }));
await subscribe(cfg.queues.all, { RawMessageDelivery: "true" });
await subscribe(cfg.queues.attributes, {
  RawMessageDelivery: "true",
  FilterPolicy: JSON.stringify({ tier: ["gold", "platinum"], amount: [{ numeric: [">=", 100] }] }),
});
const bodySub = (await subscribe(cfg.queues.body, { RawMessageDelivery: "true" })).SubscriptionArn;
for (const [name, value] of [
  ["FilterPolicyScope", "MessageBody"],
  ["FilterPolicy", JSON.stringify({ order: { country: [{ "anything-but": ["FR"] }] } })],
]) {
  await sns.send(new SetSubscriptionAttributesCommand({ SubscriptionArn: bodySub, AttributeName: name, AttributeValue: value }));
}
out.badPolicy = await failure(
  subscribe(cfg.queues.all, { FilterPolicy: JSON.stringify({ tier: [{ exists: "yes" }] }) })
);

const publishes = [
  ["gold-150", { tier: str("gold"), amount: num(150) }, { order: { country: "DE" } }],
  ["gold-50", { tier: str("gold"), amount: num(50) }, { order: { country: "FR" } }],
  ["silver-500", { tier: str("silver"), amount: num(500) }, { order: { country: "US" } }],
];
for (const [id, attributes, body] of publishes) {
  await sns.send(new PublishCommand({ TopicArn: topic, Message: JSON.stringify({ id, ...body }), MessageAttributes: attributes }));
}

// PublishBatch to the same topic: filtered per entry, as a Publish would be
const batch = await sns.send(
  new PublishBatchCommand({
    TopicArn: topic,
    PublishBatchRequestEntries: [
      { Id: "b1", Message: JSON.stringify({ id: "batch-platinum", order: { country: "FR" } }), MessageAttributes: { tier: str("platinum"), amount: num(1000) } },
      { Id: "b2", Message: JSON.stringify({ id: "batch-bronze", order: { country: "IT" } }), MessageAttributes: { tier: str("bronze"), amount: num(1000) } },
    ],
  })
);
out.batchSuccessful = batch.Successful.map((s) => s.Id);
out.batchFailed = (batch.Failed ?? []).length;
out.tooMany = await failure(
  sns.send(
    new PublishBatchCommand({
      TopicArn: topic,
      PublishBatchRequestEntries: Array.from({ length: 11 }, (_, i) => ({ Id: `e${i}`, Message: "m" })),
    })
  )
);
out.notDistinct = await failure(
  sns.send(new PublishBatchCommand({ TopicArn: topic, PublishBatchRequestEntries: [{ Id: "x", Message: "a" }, { Id: "x", Message: "b" }] }))
);

// a FIFO topic into a FIFO queue, by PublishBatch
const fifo = (
  await sns.send(new CreateTopicCommand({ Name: `${cfg.name}.fifo`, Attributes: { FifoTopic: "true", ContentBasedDeduplication: "true" } }))
).TopicArn;
await sns.send(new SubscribeCommand({ TopicArn: fifo, Protocol: "sqs", Endpoint: cfg.queues.fifo, Attributes: { RawMessageDelivery: "true" } }));
const fifoBatch = await sns.send(
  new PublishBatchCommand({
    TopicArn: fifo,
    PublishBatchRequestEntries: ["f1", "f2", "f3"].map((m) => ({ Id: m, Message: m, MessageGroupId: "g" })),
  })
);
out.fifoSequence = fifoBatch.Successful.map((s) => s.SequenceNumber);
out.fifoNoGroup = await failure(
  sns.send(new PublishBatchCommand({ TopicArn: fifo, PublishBatchRequestEntries: [{ Id: "n", Message: "n" }] }))
);

console.log(JSON.stringify(out));
