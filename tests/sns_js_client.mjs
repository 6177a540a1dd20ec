// Drives the SNS endpoint with the AWS SDK for JavaScript v3 (@aws-sdk/client-sns), unmodified.
// Run by tests/test_sns_js_client.py: `node tests/sns_js_client.mjs '<config JSON>'`; prints one
// JSON object with what each step saw. Every SNS call goes through the SDK; only the endpoint's
// own control API (faults, a handset's STOP reply) is called with fetch.
import {
  SNSClient,
  CheckIfPhoneNumberIsOptedOutCommand,
  CreatePlatformApplicationCommand,
  CreatePlatformEndpointCommand,
  GetEndpointAttributesCommand,
  ListEndpointsByPlatformApplicationCommand,
  ListPhoneNumbersOptedOutCommand,
  PublishCommand,
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
    return {
      name: e.name,
      status: e.$metadata?.httpStatusCode,
      attempts: e.$metadata?.attempts,
      message: e.message,
      fault: e.$fault,
    };
  }
}

async function control(method, path, body) {
  const response = await fetch(cfg.sns + path, {
    method,
    headers: { "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status}`);
  return response.json();
}

const apnsAttributes = {
  PlatformCredential: cfg.p8Key,
  PlatformPrincipal: "ABCDE12345",
  ApplePlatformTeamID: "TEAM123456",
  ApplePlatformBundleID: "com.example.js",
};
const app = (
  await sns.send(
    new CreatePlatformApplicationCommand({ Name: cfg.name, Platform: "APNS", Attributes: apnsAttributes })
  )
).PlatformApplicationArn;
out.app = app;

// create, idempotent create, the conflicting-attributes error
const create = (token, data) =>
  sns.send(new CreatePlatformEndpointCommand({ PlatformApplicationArn: app, Token: token, CustomUserData: data }));
out.endpoint = (await create(cfg.liveToken, "u1")).EndpointArn;
out.again = (await create(cfg.liveToken, "u1")).EndpointArn;
out.conflict = await failure(create(cfg.liveToken, "u2"));

// publish to APNs with a per-platform payload and the collapse id attribute
out.apnsMessageId = (
  await sns.send(
    new PublishCommand({
      TargetArn: out.endpoint,
      MessageStructure: "json",
      Message: JSON.stringify({ APNS: JSON.stringify({ aps: { alert: "from js" }, notification_id: "js-1" }) }),
      MessageAttributes: {
        "AWS.SNS.MOBILE.APNS.COLLAPSE_ID": { DataType: "String", StringValue: "js-1" },
        "AWS.SNS.MOBILE.APNS.PRIORITY": { DataType: "String", StringValue: "10" },
      },
    })
  )
).MessageId;

// publish to FCM (v1 payload) through a GCM application
const gcm = (
  await sns.send(
    new CreatePlatformApplicationCommand({
      Name: `${cfg.name}-android`,
      Platform: "GCM",
      Attributes: { PlatformCredential: cfg.serviceAccount },
    })
  )
).PlatformApplicationArn;
const gcmEndpoint = (
  await sns.send(new CreatePlatformEndpointCommand({ PlatformApplicationArn: gcm, Token: cfg.fcmToken }))
).EndpointArn;
const v1 = { fcmV1Message: { message: { data: { notification_id: "js-2" }, android: { collapse_key: "js-2" } } } };
out.fcmMessageId = (
  await sns.send(
    new PublishCommand({ TargetArn: gcmEndpoint, MessageStructure: "json", Message: JSON.stringify({ GCM: JSON.stringify(v1) }) })
  )
).MessageId;

// a dead token: accepted, the endpoint turns off, the next publish is EndpointDisabled
const dead = (await create(cfg.deadToken, undefined)).EndpointArn;
out.deadMessageId = (await sns.send(new PublishCommand({ TargetArn: dead, Message: "are you there" }))).MessageId;
out.deadAttributes = (await sns.send(new GetEndpointAttributesCommand({ EndpointArn: dead }))).Attributes;
out.disabled = await failure(sns.send(new PublishCommand({ TargetArn: dead, Message: "again" })));

// paging: 120 more endpoints, listed with NextToken
for (let i = 0; i < 120; i++) await create(cfg.pagingTokens[i], undefined);
const listed = [];
let next;
out.pages = 0;
do {
  const page = await sns.send(new ListEndpointsByPlatformApplicationCommand({ PlatformApplicationArn: app, NextToken: next }));
  listed.push(...page.Endpoints.map((e) => e.EndpointArn));
  next = page.NextToken;
  out.pages += 1;
} while (next && out.pages < 10);
out.listed = listed.length;
out.listedUnique = new Set(listed).size;

// error codes
out.notFound = await failure(sns.send(new GetEndpointAttributesCommand({ EndpointArn: out.endpoint.slice(0, -4) + "0000" })));
out.badPhone = await failure(sns.send(new PublishCommand({ PhoneNumber: "12345", Message: "x" })));
out.foreign = await failure(
  sns.send(new PublishCommand({ TargetArn: out.endpoint.replace(":000000000000:", ":123456789012:"), Message: "x" }))
);
out.badAttribute = await failure(
  sns.send(
    new PublishCommand({
      TargetArn: out.endpoint,
      Message: "x",
      MessageAttributes: { n: { DataType: "Number", StringValue: "ten" } },
    })
  )
);

// the endpoint's throttle fault
const fault = await control("POST", "/_sns/faults", { fault: "throttle", params: { p: 1 }, targets: [app] });
out.throttled = await failure(sns.send(new PublishCommand({ TargetArn: out.endpoint, Message: "x" })));
// the SDK's own retry strategy treats Throttling as retryable: 3 attempts, then the error
const retrying = new SNSClient({
  endpoint: cfg.sns,
  region: "us-east-1",
  credentials: { accessKeyId: "testing", secretAccessKey: "testing" },
  maxAttempts: 3,
});
out.throttledRetried = await failure(retrying.send(new PublishCommand({ TargetArn: out.endpoint, Message: "x" })));
await control("DELETE", `/_sns/faults/${fault.id}`);

// SMS with opt-out
out.smsMessageId = (
  await sns.send(
    new PublishCommand({
      PhoneNumber: cfg.phone,
      Message: "code 4242",
      MessageAttributes: { "AWS.SNS.SMS.SMSType": { DataType: "String", StringValue: "Transactional" } },
    })
  )
).MessageId;
out.optedOutBefore = (await sns.send(new CheckIfPhoneNumberIsOptedOutCommand({ phoneNumber: cfg.phone }))).isOptedOut;
await control("POST", "/_sns/sms/replies", { phoneNumber: cfg.phone, text: "STOP" });
out.optedOutAfter = (await sns.send(new CheckIfPhoneNumberIsOptedOutCommand({ phoneNumber: cfg.phone }))).isOptedOut;
out.optedOutListed = (await sns.send(new ListPhoneNumbersOptedOutCommand({}))).phoneNumbers.includes(cfg.phone);
out.smsAfterStop = (await sns.send(new PublishCommand({ PhoneNumber: cfg.phone, Message: "code 4343" }))).MessageId;

console.log(JSON.stringify(out));
